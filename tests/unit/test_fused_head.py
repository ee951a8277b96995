"""Fused (EAGLE-3 style) MTP heads on tiny random models: the target's forward run layer by layer
gives bit-identical logits, old head files load as last-layer heads, a pass-through fused head
drafts as its last-layer twin, the data keeps the layers, training and acceptance replay read
them, the expected-length depth weights, and the served modes keep greedy output unchanged."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from kernels.features import body, check_layers
from kernels.loader import output_head
from kernels.mtp_head import HEAD_CONFIG, MTPConfig, MTPHead, load_mtp_head, save_mtp_head
from kernels.mtp_loss import expected_length_weights
from tests.tiny import save_tiny_dir, tiny_llama

SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
PROMPT = [3, 17, 42, 9, 88, 5, 61, 23]


@pytest.mark.parametrize("layers", [(0,), (0, 1)])
def test_the_layered_forward_gives_the_stock_logits_bit_for_bit(layers):
    model = tiny_llama(seed=4)
    stock, mine = make_prompt_cache(model), make_prompt_cache(model)
    for tokens in (mx.array([PROMPT]), mx.array([[7]]), mx.array([[9, 4, 2]])):  # prefill, step, verify
        want = model(tokens, cache=stock)
        final, features = body(model, tokens, mine, layers)
        assert mx.array_equal(output_head(model)(final), want)
        assert features.shape[-1] == 64 * (1 + len(layers)) and mx.array_equal(features[..., -64:], final)
    # A left-padded batch cache (mtp_batch) too.
    rows = mx.array([[0, 0] + PROMPT[:4], PROMPT[:6]])
    stock, mine = [[BatchKVCache([2, 0]) for _ in model.model.layers] for _ in range(2)]
    final, _ = body(model, rows, mine, layers)
    assert mx.array_equal(output_head(model)(final), model(rows, cache=stock))


def test_layer_features_are_the_decoder_layers_outputs():
    model = tiny_llama(seed=4)
    tokens = mx.array([PROMPT])
    _, features = body(model, tokens, None, (0,))
    inner = model.model
    h = inner.layers[0](inner.embed_tokens(tokens), "causal", cache=None)
    np.testing.assert_allclose(np.array(features[..., :64]), np.array(h), atol=1e-5)
    with pytest.raises(ValueError, match="ascending"):
        check_layers(model, (1, 0))
    with pytest.raises(ValueError, match="below 2"):
        check_layers(model, (2,))


def test_a_head_saved_without_feature_layers_loads_as_a_last_layer_head(tmp_path):
    mx.random.seed(1)
    head = MTPHead(MTPConfig(**SMALL))
    save_mtp_head(head, tmp_path)
    record = json.loads((tmp_path / HEAD_CONFIG).read_text())
    record.pop("feature_layers")  # as every head written before fused heads
    (tmp_path / HEAD_CONFIG).write_text(json.dumps(record))
    loaded = load_mtp_head(tmp_path)
    assert loaded.config.feature_layers == () and "features" not in loaded
    fused = MTPHead(MTPConfig(**SMALL, feature_layers=(0,)))
    save_mtp_head(fused, tmp_path / "fused")
    again = load_mtp_head(tmp_path / "fused")
    assert again.config.feature_layers == (0,) and again.config.feature_width == 128


def test_a_pass_through_fused_head_drafts_as_its_last_layer_twin():
    model = tiny_llama(seed=4)
    mx.random.seed(2)
    plain_head = MTPHead(MTPConfig(**SMALL))
    fused = MTPHead(MTPConfig(**SMALL, feature_layers=(0, 1)))
    fused.load_weights(tree_flatten(plain_head.parameters()), strict=False)
    fused.features.pass_through()
    tokens = mx.array([PROMPT])
    hidden, features = body(model, tokens, None, (0, 1))
    embed, norm, lm = model.model.embed_tokens, model.model.norm, output_head(model)
    a = plain_head.draft(hidden[0, :-1], PROMPT[1:], 3, embed, norm, lm, plain_head.make_cache())
    b = fused.draft(features[0, :-1], PROMPT[1:], 3, embed, norm, lm, fused.make_cache())
    assert a.ids == b.ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_data_keeps_the_layers_and_replay_feeds_each_head_its_own(tmp_path):
    from kernels.mtp_batches import sequences_from
    from kernels.mtp_data import generate_traces, load_shards, save_shard
    from kernels.mtp_eval import measure_heads

    model = tiny_llama(seed=4)
    prompts = [PROMPT, PROMPT[:5]]
    plain_traces = generate_traces(model, prompts, 6, set())
    traces = generate_traces(model, prompts, 6, set(), layers=(0, 1))
    for p, t in zip(plain_traces, traces):
        assert p.tokens == t.tokens and np.array_equal(p.hidden, t.hidden) and p.features is None
        _, features = body(model, mx.array([t.tokens[:-1]]), None, (0, 1))
        np.testing.assert_allclose(t.features[:-1], np.array(features[0, :, :128]), atol=2e-2)
    save_shard(traces, tmp_path / "shard-00000.safetensors")
    seqs = sequences_from(load_shards(tmp_path), stored=(0, 1), wanted=(1,))
    assert np.array_equal(seqs[0].features, traces[0].features[:, 64:])
    # Over the same base runs, a pass-through fused head and its twin accept alike.
    mx.random.seed(2)
    twin = MTPHead(MTPConfig(**SMALL))
    fused = MTPHead(MTPConfig(**SMALL, feature_layers=(1,)))
    fused.load_weights(tree_flatten(twin.parameters()), strict=False)
    fused.features.pass_through()
    a, b = measure_heads(model, [twin, fused], prompts, 3, 8, batch=2)
    assert a.accepted == b.accepted and a.eligible == b.eligible


def test_the_feature_cost_is_timed_beside_the_stock_forward():
    from kernels.mtp_eval import verify_ms

    model = tiny_llama(seed=4)
    for layers in ((), (0,)):
        stock, fed = verify_ms(model, 2, layers, context=8, repeats=2)
        assert stock > 0 and fed > 0


def test_expected_length_weights_are_the_gain_of_each_depth():
    # One chain starting at position 0: c1 = 0.5 (pass 0, j=0), c2 = 0.4 (pass 1, j=1), c3 = 0.3 (pass 2, j=2).
    probs = [mx.array([[0.5, 0.0, 0.0]]), mx.array([[0.0, 0.4, 0.0]]), mx.array([[0.0, 0.0, 0.3]])]
    w = [np.array(x)[0] for x in expected_length_weights(probs)]
    # E = 1 + c1 + c1 c2 + c1 c2 c3: dE/dc1 = 1 + c2 + c2 c3, dE/dc2 = c1 (1 + c3), dE/dc3 = c1 c2.
    assert w[0][0] == pytest.approx(1 + 0.4 + 0.4 * 0.3)
    assert w[1][1] == pytest.approx(0.5 * 1.3)
    assert w[2][2] == pytest.approx(0.5 * 0.4)


def test_a_fused_head_trains_with_expected_length_weights(tmp_path):
    from kernels.mtp_data import generate_traces, save_shard
    from kernels.mtp_train import parser, run

    base = tiny_llama()
    base.freeze()
    data = tmp_path / "data"
    data.mkdir()
    prompts = [[3, 17, 42, 9, 88, 5], [1, 2, 3, 4], [100, 7, 12, 64, 31], [5, 6, 7]] * 6  # 20+: one held back
    save_shard(generate_traces(base, prompts, 14, set(), layers=(0,)), data / "shard-00000.safetensors")
    (data / "recipe.json").write_text(json.dumps({"feature_layers": [0]}))
    out = tmp_path / "run"
    args = parser().parse_args(["--data", str(data), "--out", str(out), "--steps", "8", "--batch", "2",
                                "--window", "8", "--draft-vocab", "48", "--depths", "3", "--init", "random",
                                "--lr", "3e-3", "--warmup", "2", "--log-every", "1", "--eval-every", "100",
                                "--feature-layers", "0", "--weighting", "expected-length"])
    run(args, base=base)
    logged = [json.loads(line) for line in (out / "train.log").read_text().splitlines()]
    losses = [r["loss"] for r in logged if "loss" in r]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    validation = json.loads((out / "train.json").read_text())["validation"]
    assert len(validation["top1_by_depth"]) == 3 and validation["expected_length"] >= 1
    assert load_mtp_head(out / "head").config.feature_layers == (0,)


@pytest.fixture(scope="module")
def fused_model_dir(tmp_path_factory):
    folder = save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny-fused", seed=5)
    mx.random.seed(5)
    head = MTPHead(MTPConfig(**SMALL, feature_layers=(0,)))
    mx.eval(head.parameters())
    save_mtp_head(head, folder)
    return folder


@pytest.mark.parametrize("mode", ["serial", "mtp_batch", "hyper"])
async def test_served_greedy_output_with_a_fused_head_equals_plain_decode(mode, fused_model_dir):
    from runtime.bench._inprocess import Served, at_width, fixed_depth, plain, private_cache
    from runtime.config import load_config, override
    from runtime.messages import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    config = fixed_depth(load_config(), "mtp", 3)  # speculate at every step, nothing measured
    config = override(config, "scheduler", mode="hyper") if mode == "hyper" else at_width(config, 1 + (mode == "mtp_batch"))
    prompts = [[7, 8, 9, 10] * 4, [3, 4, 5] * 5]
    with private_cache(config) as config:
        async with Served(config, fused_model_dir) as client:
            assert client.system.info.drafter == "mtp"
            pairs = [(await client.generate(p, plain(greedy)), await client.generate(p, greedy)) for p in prompts]
    assert all(a.tokens == b.tokens for a, b in pairs)
    assert sum(b.receipt.verify_steps for _, b in pairs) > 0
