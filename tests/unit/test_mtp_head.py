"""MTP head on a tiny random llama target: shapes, chaining, cache rollback, files, Qwen keys,
reduced draft vocabulary."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.models.cache import trim_prompt_cache

from kernels.mtp_head import (
    HEAD_CONFIG,
    HEAD_WEIGHTS,
    MTPConfig,
    MTPHead,
    init_draft_vocab,
    shrink_draft_vocab,
    load_mtp_head,
    save_mtp_head,
)
from kernels.mtp_qwen import load_qwen_mtp_head, map_qwen_mtp_weights, qwen_mtp_config
from kernels.sampling import greedy

VOCAB, HIDDEN = 128, 64
LLAMA_HEAD = MTPConfig(
    hidden_size=HIDDEN, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
)
QWEN_HEAD = MTPConfig(
    hidden_size=HIDDEN,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=96,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    head_dim=32,
    rope_dims=8,
    qk_norm=True,
    gated_attention=True,
    own_norm=True,
)


@pytest.fixture(scope="module")
def target():
    mx.random.seed(0)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def make_head(config: MTPConfig = LLAMA_HEAD, seed: int = 1) -> MTPHead:
    mx.random.seed(seed)
    head = MTPHead(config)
    # Random init is near-uniform over the vocabulary; a larger scale makes drafts decisive.
    head.update({"fc": {"weight": head.fc.weight * 4}})
    mx.eval(head.parameters())
    return head


def pairs(model, tokens: list[int]) -> tuple[mx.array, list[int]]:
    """Exact pairs (h_j, t_{j+1}) for a token list: hidden [L-1, d] and the tokens that follow."""
    hidden = model.model(mx.array([tokens]))[0]
    return hidden[:-1], tokens[1:]


def draft(head, model, cache, hidden, next_tokens, k, **kw):
    embed = model.model.embed_tokens
    return head.draft(
        hidden, next_tokens, k, embed, model.model.norm, embed.as_linear, cache, **kw
    )


def absorb(head, model, cache, hidden, next_tokens):
    head.absorb(hidden, next_tokens, model.model.embed_tokens, model.model.norm, cache)


PROMPT = [3, 17, 42, 9, 88, 5, 61, 23, 100, 7, 12]


@pytest.mark.parametrize("config", [LLAMA_HEAD, QWEN_HEAD], ids=["llama-like", "qwen-like"])
def test_greedy_draft_shapes_and_types(target, config):
    head = make_head(config)
    cache = head.make_cache()
    hidden, following = pairs(target, PROMPT)
    out = draft(head, target, cache, hidden, following, 4)
    assert len(out.ids) == 4 and all(isinstance(t, int) and 0 <= t < VOCAB for t in out.ids)
    assert len(out.logprobs) == 4 and all(isinstance(x, float) and x <= 0 for x in out.logprobs)
    assert out.probs is None
    # Only the exact pairs stay in the cache; the 3 speculative positions are gone.
    assert cache[0].offset == len(following)


def test_sampled_draft_returns_q_and_is_seeded(target):
    head = make_head()
    hidden, following = pairs(target, PROMPT)
    runs = []
    for _ in range(2):
        cache = head.make_cache()
        sampled = dict(temperature=0.8, top_p=0.9, key=mx.random.key(4))
        runs.append(draft(head, target, cache, hidden, following, 3, **sampled))
    assert runs[0].ids == runs[1].ids
    q = np.array(runs[0].probs)
    assert q.shape == (3, VOCAB)
    np.testing.assert_allclose(q.sum(axis=-1), 1.0, rtol=1e-5)
    assert all(q[i, t] > 0 for i, t in enumerate(runs[0].ids))


def test_chain_feeds_its_own_hidden_state_and_token(target):
    head = make_head()
    hidden, following = pairs(target, PROMPT)
    got = draft(head, target, head.make_cache(), hidden, following, 3).ids
    # The same chain, one depth at a time through the public forward.
    embed, norm = target.model.embed_tokens, target.model.norm
    cache = head.make_cache()
    h = head.forward(hidden[None], mx.array([following]), embed, norm, cache)[:, -1:]
    want = []
    for _ in range(3):
        want.append(greedy(embed.as_linear(h)[0, 0]).item())
        h = head.forward(h, mx.array([[want[-1]]]), embed, norm, cache)
    assert got == want
    assert len(set(got)) > 1 or got[0] != following[-1]  # not a constant echo


def test_shallower_draft_is_a_prefix_of_a_deeper_one(target):
    head = make_head()
    hidden, following = pairs(target, PROMPT)
    deep = draft(head, target, head.make_cache(), hidden, following, 6)
    shallow = draft(head, target, head.make_cache(), hidden, following, 2)
    assert deep.ids[:2] == shallow.ids
    np.testing.assert_allclose(deep.logprobs[:2], shallow.logprobs, rtol=1e-4)


def test_feeding_pairs_in_chunks_equals_feeding_them_at_once(target):
    head = make_head()
    hidden, following = pairs(target, PROMPT)
    whole = draft(head, target, head.make_cache(), hidden, following, 4)
    cache = head.make_cache()
    absorb(head, target, cache, hidden[:4], following[:4])
    absorb(head, target, cache, hidden[4:7], following[4:7])
    chunked = draft(head, target, cache, hidden[7:], following[7:], 4)
    assert chunked.ids == whole.ids
    np.testing.assert_allclose(chunked.logprobs, whole.logprobs, rtol=1e-4, atol=1e-5)


def test_trim_rolls_back_to_the_prefix(target):
    head = make_head()
    hidden, following = pairs(target, PROMPT)
    other_hidden, other_following = pairs(target, [1, 2, 3, 4, 5, 6])
    # Cache A sees the prefix, then a branch that is cut away; cache B only sees the prefix.
    rolled = head.make_cache()
    absorb(head, target, rolled, hidden[:6], following[:6])
    absorb(head, target, rolled, other_hidden, other_following)
    assert trim_prompt_cache(rolled, len(other_following)) == len(other_following)
    fresh = head.make_cache()
    absorb(head, target, fresh, hidden[:6], following[:6])
    a = draft(head, target, rolled, hidden[6:], following[6:], 5)
    b = draft(head, target, fresh, hidden[6:], following[6:], 5)
    assert a.ids == b.ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-4, atol=1e-5)


def test_rejected_drafts_leave_nothing_behind(target):
    head = make_head()
    hidden, following = pairs(target, PROMPT)
    drafted = head.make_cache()
    draft(head, target, drafted, hidden[:5], following[:5], 6)  # all six drafts "rejected"
    plain = head.make_cache()
    absorb(head, target, plain, hidden[:5], following[:5])
    a = draft(head, target, drafted, hidden[5:], following[5:], 3)
    b = draft(head, target, plain, hidden[5:], following[5:], 3)
    assert a.ids == b.ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("config", [LLAMA_HEAD, QWEN_HEAD], ids=["llama-like", "qwen-like"])
def test_save_load_round_trip(target, tmp_path, config):
    head = make_head(config)
    directory = save_mtp_head(head, tmp_path / "head")
    assert (directory / HEAD_WEIGHTS).exists() and (directory / HEAD_CONFIG).exists()
    hidden, following = pairs(target, PROMPT)
    want = draft(head, target, head.make_cache(), hidden, following, 4)
    for path in (directory, directory / HEAD_WEIGHTS):
        loaded = load_mtp_head(path)
        assert loaded.config == config
        got = draft(loaded, target, loaded.make_cache(), hidden, following, 4)
        assert got.ids == want.ids
        np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-5)


def test_load_refuses_weights_that_do_not_fit(tmp_path):
    directory = save_mtp_head(make_head(), tmp_path)
    config = json.loads((directory / HEAD_CONFIG).read_text())
    (directory / HEAD_CONFIG).write_text(json.dumps({**config, "intermediate_size": 64}))
    with pytest.raises(ValueError):
        load_mtp_head(directory)


def test_per_depth_heads_are_refused_clearly():
    with pytest.raises(NotImplementedError):
        MTPHead(MTPConfig(**{**LLAMA_HEAD.__dict__, "num_layers": 2}))


# --- Qwen3.5 checkpoint keys ------------------------------------------------------------------


def fake_qwen_checkpoint(head: MTPHead) -> dict[str, mx.array]:
    """What a raw HF checkpoint holds for this head: `mtp.` names, zero-centred norms, and more."""
    checkpoint = {
        "model.embed_tokens.weight": mx.zeros((VOCAB, HIDDEN)),
        "lm_head.weight": mx.zeros((VOCAB, HIDDEN)),
        "model.layers.0.input_layernorm.weight": mx.zeros((HIDDEN,)),
    }
    for name, value in tree_flatten(head.parameters()):
        stored = value - 1.0 if name.endswith("norm.weight") else value
        checkpoint[f"mtp.{name}"] = stored
    return checkpoint


def test_qwen_key_names_are_the_checkpoint_names():
    names = {name for name, _ in tree_flatten(make_head(QWEN_HEAD).parameters())}
    assert {
        "pre_fc_norm_hidden.weight",
        "pre_fc_norm_embedding.weight",
        "fc.weight",
        "norm.weight",
        "layers.0.input_layernorm.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight",
        "layers.0.post_attention_layernorm.weight",
        "layers.0.mlp.gate_proj.weight",
    } <= names
    # Gated attention: q_proj yields queries and a gate for each of the 2 heads of size 32.
    assert make_head(QWEN_HEAD).layers[0].self_attn.q_proj.weight.shape == (2 * 2 * 32, HIDDEN)


def test_qwen_mapping_restores_the_head():
    head = make_head(QWEN_HEAD)
    mapped = map_qwen_mtp_weights(fake_qwen_checkpoint(head))
    assert not any(name.startswith(("mtp.", "model.", "lm_head")) for name in mapped)
    original = dict(tree_flatten(head.parameters()))
    assert mapped.keys() == original.keys()
    for name, value in mapped.items():
        np.testing.assert_allclose(np.array(value), np.array(original[name]), atol=1e-6)


def test_qwen_mapping_refuses_moe_layers_and_empty_checkpoints():
    with pytest.raises(ValueError, match="mixture-of-experts"):
        map_qwen_mtp_weights({"mtp.layers.0.mlp.experts.0.up_proj.weight": mx.zeros((2, 2))})
    with pytest.raises(ValueError, match="no 'mtp.'"):
        map_qwen_mtp_weights({"model.norm.weight": mx.zeros((2,))})


QWEN35_CONFIG = {
    "model_type": "qwen3_5",
    "text_config": {
        "hidden_size": HIDDEN,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 96,
        "rms_norm_eps": 1e-6,
        "mtp_num_hidden_layers": 1,
        "rope_parameters": {"rope_theta": 1e6, "partial_rotary_factor": 0.25},
    },
}


def test_qwen_config_mapping():
    assert qwen_mtp_config(QWEN35_CONFIG) == QWEN_HEAD


def test_load_qwen_head_from_a_checkpoint_directory(target, tmp_path):
    head = make_head(QWEN_HEAD)
    checkpoint = fake_qwen_checkpoint(head)
    mtp = {k: v for k, v in checkpoint.items() if k.startswith("mtp.")}
    rest = {k: v for k, v in checkpoint.items() if not k.startswith("mtp.")}
    mx.save_safetensors(str(tmp_path / "model-00001-of-00002.safetensors"), rest)
    mx.save_safetensors(str(tmp_path / "model-00002-of-00002.safetensors"), mtp)
    weight_map = {k: "model-00002-of-00002.safetensors" for k in mtp}
    weight_map |= {k: "model-00001-of-00002.safetensors" for k in rest}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_CONFIG))
    loaded = load_qwen_mtp_head(tmp_path)
    hidden, following = pairs(target, PROMPT)
    want = draft(head, target, head.make_cache(), hidden, following, 3)
    got = draft(loaded, target, loaded.make_cache(), hidden, following, 3)
    assert got.ids == want.ids
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-4, atol=1e-5)


def test_nothing_to_feed(target):
    head = make_head()
    cache = head.make_cache()
    absorb(head, target, cache, mx.zeros((0, HIDDEN)), [])
    assert cache[0].offset == 0
    with pytest.raises(ValueError):
        draft(head, target, cache, mx.zeros((0, HIDDEN)), [], 2)


# --- Reduced draft vocabulary -----------------------------------------------------------------

REDUCED = 32


def reduced_config(size: int = REDUCED) -> MTPConfig:
    return MTPConfig(**{**LLAMA_HEAD.__dict__, "draft_vocab_size": size, "vocab_size": VOCAB})


def reduced_twin(head: MTPHead, target, token_ids) -> MTPHead:
    """A reduced head with `head`'s weights, drafting over `token_ids` of the target's LM head."""
    twin = MTPHead(reduced_config(len(token_ids)))
    twin.update(head.parameters())
    init_draft_vocab(twin, target.model.embed_tokens.weight, token_ids)
    return twin


def test_a_full_permuted_draft_vocabulary_drafts_what_the_full_lm_head_drafts(target):
    head = make_head()
    permuted = np.random.default_rng(0).permutation(VOCAB).tolist()
    twin = reduced_twin(head, target, permuted)
    hidden, following = pairs(target, PROMPT)
    full = draft(head, target, head.make_cache(), hidden, following, 5)
    reduced = draft(twin, target, twin.make_cache(), hidden, following, 5)
    assert reduced.ids == full.ids
    np.testing.assert_allclose(reduced.logprobs, full.logprobs, rtol=1e-4, atol=1e-5)


def test_reduced_drafts_are_full_ids_from_the_map(target):
    head = make_head()
    kept = list(range(0, VOCAB, 4))  # 32 ids, mapped back from draft indices 0..31
    twin = reduced_twin(head, target, kept)
    hidden, following = pairs(target, PROMPT)
    out = draft(twin, target, twin.make_cache(), hidden, following, 6)
    assert all(t in kept for t in out.ids)
    assert any(t >= REDUCED for t in out.ids)  # full ids, not draft indices


def test_reduced_sampled_q_lives_on_the_map_in_the_full_vocabulary(target):
    twin = reduced_twin(make_head(), target, list(range(1, VOCAB, 4)))
    hidden, following = pairs(target, PROMPT)
    sampled = dict(temperature=1.0, key=mx.random.key(2))
    out = draft(twin, target, twin.make_cache(), hidden, following, 3, **sampled)
    q = np.array(out.probs)
    assert q.shape == (3, VOCAB)
    np.testing.assert_allclose(q.sum(axis=-1), 1.0, rtol=1e-5)
    outside = np.ones(VOCAB, bool)
    outside[1::4] = False
    assert np.all(q[:, outside] == 0)
    assert all(q[i, t] > 0 for i, t in enumerate(out.ids))


def test_reduced_head_round_trips_through_files(target, tmp_path):
    twin = reduced_twin(make_head(), target, list(range(VOCAB - 1, -1, -4)))
    hidden, following = pairs(target, PROMPT)
    want = draft(twin, target, twin.make_cache(), hidden, following, 4)
    loaded = load_mtp_head(save_mtp_head(twin, tmp_path / "exact"))
    assert loaded.config == twin.config and loaded.vocab_map.dtype == mx.int32
    assert loaded.vocab_map.tolist() == twin.vocab_map.tolist()
    assert draft(loaded, target, loaded.make_cache(), hidden, following, 4).ids == want.ids
    # Shipped in float16: floats halve, ids stay exact integers.
    small = save_mtp_head(twin, tmp_path / "half", dtype=mx.float16)
    stored = mx.load(str(small / HEAD_WEIGHTS))
    assert stored["fc.weight"].dtype == mx.float16 and stored["vocab_map"].dtype == mx.int32
    assert load_mtp_head(small).vocab_map.tolist() == twin.vocab_map.tolist()


def test_reduced_vocabulary_needs_the_full_size_and_a_matching_map(target):
    with pytest.raises(ValueError, match="vocab_size"):
        MTPHead(MTPConfig(**{**LLAMA_HEAD.__dict__, "draft_vocab_size": REDUCED}))
    with pytest.raises(ValueError, match="drafts over"):
        init_draft_vocab(MTPHead(reduced_config()), target.model.embed_tokens.weight, [1, 2, 3])
    with pytest.raises(ValueError, match="drafts over"):
        init_draft_vocab(make_head(), target.model.embed_tokens.weight, [1, 2, 3])


def test_shrinking_keeps_the_first_ids_of_the_map(target):
    kept = np.random.default_rng(1).permutation(VOCAB).tolist()
    twin = reduced_twin(make_head(), target, kept)
    hidden, following = pairs(target, PROMPT)
    same = shrink_draft_vocab(twin, VOCAB)
    want = draft(twin, target, twin.make_cache(), hidden, following, 4).ids
    assert draft(same, target, same.make_cache(), hidden, following, 4).ids == want
    small = shrink_draft_vocab(twin, 16)
    assert small.config.draft_vocab_size == 16 and small.vocab_map.tolist() == kept[:16]
    assert all(t in kept[:16] for t in draft(small, target, small.make_cache(), hidden, following, 4).ids)
    with pytest.raises(ValueError):
        shrink_draft_vocab(make_head(), 16)
