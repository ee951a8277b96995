"""Draft trees on tiny random models (kernels/tree.py, kernels/tree_verify.py): greedy output equals
plain decode for both layouts, for MTP spines with alternative leaves and n-gram branches, with plain
steps mixed in; the MTP head sees exactly the committed pairs; the spine is propose's chain."""

import mlx.core as mx
import pytest

from kernels.ngram_tree import propose_ngram_branches
from kernels.tree import branch_accepted, from_branches, spine_with_leaves, walk, winning_branch
from tests.tiny import tiny_llama
from tests.unit.test_speculative_engine import N, PROMPTS, make_engine, plain


def oracle_tree(spine, truth, step):
    """A tree whose true continuation sits off the spine on some steps: a wrong spine with the truth
    as an alternative chain, a leaf, or a chain sharing the truth's first token and then diverging."""
    k = len(spine)
    if step % 4 == 1:
        wrong = [t + 1 for t in truth[:k]]
        return from_branches([wrong, truth[:k], truth[:1] + [t + 2 for t in truth[1:k]]])
    if step % 4 == 2:
        return spine_with_leaves(spine, [(1, truth[0]), (min(k, 2), truth[min(k, 2) - 1])])
    if step % 4 == 3:
        return from_branches([spine, truth[:max(1, k - 1)]])
    return from_branches([spine])


def tree_run(engine, kind, prompt, k, layout, mix_plain, oracle):
    out = [engine.prefill("s", prompt, 0.0, 1.0, None, lookahead=mix_plain)]
    step = 0
    while len(out) < N:
        step += 1
        if mix_plain and step % 5 == 0:
            out += engine.decode(["s"], [True])
            continue
        if kind == "ngram":
            branches = propose_ngram_branches(prompt + out, k, width=3)
            if not branches:
                out += engine.decode(["s"], [False])
                continue
            tree = from_branches(branches + [oracle[len(out):len(out) + k]] * (step % 2))
        else:
            spine = engine.propose_tree("s", k, top=2)[0]
            tree = oracle_tree(spine, oracle[len(out):len(out) + k], step)
        result = engine.verify_tree("s", tree, layout)
        assert len(result.emitted) == result.accepted + 1
        out += result.emitted
    return out


@pytest.mark.parametrize("kind", ["ngram", "mtp", "mtp-fused"])
@pytest.mark.parametrize("layout", ["mask", "rows"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("mix_plain", [False, True])
def test_greedy_tree_speculation_equals_plain_decode(kind, layout, k, mix_plain):
    model = tiny_llama(seed=4)
    for prompt in PROMPTS:
        oracle = plain(model, prompt, N + 8)
        engine = make_engine(kind, model)
        assert tree_run(engine, kind, prompt, k, layout, mix_plain, oracle)[:N] == oracle[:N]


@pytest.mark.parametrize("layout", ["mask", "rows"])
@pytest.mark.parametrize("kind", ["mtp", "mtp-fused"])
def test_the_mtp_head_sees_exactly_the_committed_pairs_after_tree_steps(layout, kind):
    model = tiny_llama(seed=4)
    engine = make_engine(kind, model)
    prompt = PROMPTS[1]
    oracle = plain(model, prompt, N + 8)
    out = tree_run(engine, kind, prompt, 3, layout, True, oracle)
    state = engine.seqs["s"]
    engine.settle(state)
    assert state.length == len(prompt) + len(out) - 1  # every committed token but `last` is cached
    fresh = make_engine(kind, model)
    assert fresh.prefill("f", prompt + out[:-1], 0.0, 1.0, None, False) == out[-1]
    (ids, confidences), (fresh_ids, fresh_confidences) = engine.propose("s", 3), fresh.propose("f", 3)
    assert ids == fresh_ids and confidences == pytest.approx(fresh_confidences, abs=1e-4)


def test_the_spine_is_the_chain_propose_drafts_and_leaves_the_same_state():
    model = tiny_llama(seed=4)
    a, b = make_engine("mtp", model), make_engine("mtp", model)
    for e in (a, b):
        e.prefill("s", PROMPTS[2], 0.0, 1.0, None, True)
        e.decode(["s"], [True])
    for step in range(6):
        chain, confidences = a.propose("s", 3)
        spine, spine_conf, alternatives = b.propose_tree("s", 3, top=2)
        assert spine == chain and spine_conf == confidences
        assert all(len(alts) == 2 and all(t != s for t, _ in alts) for alts, s in zip(alternatives, spine))
        assert all(0 <= p <= 1 for alts in alternatives for _, p in alts)
        accepted, emitted = a.verify("s", chain, True)
        a.rollback("s", 3, accepted, emitted)
        result = b.verify_tree("s", from_branches([spine]))
        assert (result.accepted, result.emitted) == (accepted, emitted)


def test_a_tree_sharing_prefixes_and_the_walk():
    tree = from_branches([[1, 2, 3], [1, 5], [4, 6, 7], [1, 2]])
    assert tree.tokens == (1, 2, 3, 5, 4, 6, 7) and tree.parents == (0, 1, 2, 1, 0, 5, 6)
    assert tree.leaves == (3, 4, 7)  # [1, 2] adds no node
    path, emitted = walk(tree, [1, 5, 9, 0, 8, 0, 0, 0])
    assert path == [1, 4] and emitted == [1, 5, 8] and winning_branch(tree, path) == 1
    assert branch_accepted(tree, [1, 5, 9, 0, 8, 0, 0, 0]) == [1, 2, 0]


def test_ngram_branches_start_with_the_chain_and_differ():
    from kernels.ngram import propose_ngram

    history = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 7, 5, 1, 2]
    branches = propose_ngram_branches(history, 3, width=4)
    assert branches[0] == propose_ngram(history, 3)
    assert branches == [[3, 7, 5], [4, 8, 1], [3, 9, 1]]
    assert propose_ngram_branches(history, 3, width=1) == [[3, 7, 5]]
    assert propose_ngram_branches([1, 2, 3], 3, width=3) == []


def test_sampled_tree_steps_are_reproducible_and_the_rows_layout_is_greedy_only():
    model = tiny_llama(seed=4)

    def run():
        engine = make_engine("mtp", model)
        out = [engine.prefill("s", PROMPTS[1], 0.9, 1.0, 11, False)]
        while len(out) < N:
            spine, _, alternatives = engine.propose_tree("s", 3, top=2)
            tree = spine_with_leaves(spine, [(d + 1, t) for d, alts in enumerate(alternatives) for t, _ in alts])
            out += engine.verify_tree("s", tree).emitted
        return out, engine

    (first, engine), (second, _) = run(), run()
    assert first == second
    with pytest.raises(ValueError, match="greedy"):
        engine.verify_tree("s", from_branches([[1, 2]]), "rows")


def test_a_model_branches_only_where_a_probe_tree_matches_its_chain():
    import mlx.nn as nn

    from kernels.tree_verify import can_branch

    assert can_branch(tiny_llama(seed=4)) is None

    class NoRope(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Module()
            self.model.layers = [nn.Linear(2, 2)]

    assert "RoPE" in can_branch(NoRope())
    model = tiny_llama(seed=4)
    for layer in model.model.layers:  # positions read elsewhere than the RoPE module: the probe fails
        layer.self_attn.rope = _Shifted(layer.self_attn.rope)
    assert "differ" in can_branch(model)


class _Shifted:
    """A RoPE that takes one position for a whole call, as a module with its own scheme might."""

    def __init__(self, rope):
        self.rope = rope

    def __call__(self, x, offset=0):
        if isinstance(offset, mx.array):
            offset = int(offset.reshape(-1)[0].item())
        return self.rope(x, offset=offset)
