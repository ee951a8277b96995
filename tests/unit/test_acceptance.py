"""Acceptance: exact greedy matching, and rejection sampling that emits the target's distribution.

The statistical check simulates 20k independent speculative steps at once (batched mx ops) on a
vocabulary of 8 with a context-free toy target, and compares the first and second emitted tokens
with the target's exact distributions by chi-square. The same check must fail for broken rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from kernels.acceptance import accept_drafts, accept_greedy, accept_rows
from kernels.sampling import probs_from_logits, sample

VOCAB, K, SAMPLES = 8, 3, 20_000


@dataclass(frozen=True)
class Toy:
    """A position-dependent, context-free target p and drafter q (q correlated with p)."""

    p: mx.array  # [K+2, V]: one extra row so a second step can start one position later
    q: mx.array  # [K+1, V]
    deterministic: bool  # drafter without q: the rule gets draft_probs=None


def make_toy(temperature=1.0, top_p=1.0, deterministic=False, seed=0) -> Toy:
    k_target, k_noise = mx.random.split(mx.random.key(seed))
    target_logits = mx.random.normal((K + 2, VOCAB), key=k_target)
    draft_logits = target_logits[: K + 1] + 1.2 * mx.random.normal((K + 1, VOCAB), key=k_noise)
    p = probs_from_logits(target_logits, temperature, top_p)
    q = probs_from_logits(draft_logits, temperature, top_p)
    return Toy(p, q, deterministic)


def _first_emitted(rule, toy: Toy, offset: int, key) -> tuple[mx.array, mx.array, mx.array]:
    """One batched speculative step whose first draft sits at position `offset`."""
    draft_key, rule_key = mx.random.split(key)
    q = mx.broadcast_to(toy.q[offset : offset + K], (SAMPLES, K, VOCAB))
    drafts = sample(q, draft_key)
    p = mx.broadcast_to(toy.p[offset : offset + K + 1], (SAMPLES, K + 1, VOCAB))
    n, next_token = rule(p, drafts, None if toy.deterministic else q, rule_key)
    first = mx.where(n >= 1, drafts[:, 0], next_token)
    return first, n, mx.where(n >= 2, drafts[:, 1], next_token)


def emitted_tokens(rule, toy: Toy, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """First and second tokens emitted by decoding with `rule`, SAMPLES times."""
    step1, step2 = mx.random.split(mx.random.key(seed))
    first, n, second_if_drafted = _first_emitted(rule, toy, 0, step1)
    # When step 1 rejected its first draft it emitted one token: a new step makes the second.
    next_step_first, _, _ = _first_emitted(rule, toy, 1, step2)
    second = mx.where(n >= 1, second_if_drafted, next_step_first)
    return np.array(first), np.array(second)


def chi_square_pvalue(tokens: np.ndarray, expected_probs: mx.array) -> float:
    """p-value of tokens drawn from expected_probs; 0 if any token lies outside its support."""
    expected = np.array(expected_probs, dtype=np.float64)
    counts = np.bincount(tokens, minlength=VOCAB)
    support = expected > 0
    if counts[~support].any():
        return 0.0
    f_exp = expected[support] / expected[support].sum() * tokens.size
    assert f_exp.min() >= 5, "toy distribution too peaked for a chi-square test"
    return float(chisquare(counts[support], f_exp).pvalue)


def check_rule(rule, toy: Toy) -> tuple[float, float]:
    first, second = emitted_tokens(rule, toy)
    return chi_square_pvalue(first, toy.p[0]), chi_square_pvalue(second, toy.p[1])


def accept_everything(target_probs, draft_ids, draft_probs, key):
    """Broken: trusts the drafter, so the drafter's distribution leaks into the output."""
    batch, k = draft_ids.shape
    return mx.full((batch,), k, mx.int32), sample(target_probs[:, k, :], key)


def resample_from_target(target_probs, draft_ids, draft_probs, key):
    """Broken: correct accept test, but draws from p instead of the residual on rejection."""
    n, _ = accept_rows(target_probs, draft_ids, draft_probs, key)
    chosen = mx.take_along_axis(target_probs, n[:, None, None], axis=1)[:, 0, :]
    return n, sample(chosen, mx.random.split(key)[1])


TOYS = {
    "sampled q": make_toy(),
    "top_p 0.8, temperature 1.5": make_toy(temperature=1.5, top_p=0.8),
    "deterministic drafter (q=None)": make_toy(deterministic=True),
    "deterministic drafter, top_p 0.9": make_toy(top_p=0.9, deterministic=True),
}


@pytest.mark.parametrize("name", TOYS)
def test_rejection_sampling_emits_the_target_distribution(name):
    first_p, second_p = check_rule(accept_rows, TOYS[name])
    assert first_p > 0.01 and second_p > 0.01, (first_p, second_p)


@pytest.mark.parametrize("broken", [accept_everything, resample_from_target])
@pytest.mark.parametrize("name", TOYS)
def test_the_check_catches_a_broken_rule(broken, name):
    first_p, second_p = check_rule(broken, TOYS[name])
    assert first_p < 0.01, first_p


def test_toy_is_a_real_test_some_drafts_rejected_some_accepted():
    toy = TOYS["sampled q"]
    _, n, _ = _first_emitted(accept_rows, toy, 0, mx.random.key(3))
    histogram = np.bincount(np.array(n), minlength=K + 1)
    assert (histogram > 0).all(), histogram


def test_accept_drafts_equals_one_row_of_accept_rows():
    toy = TOYS["sampled q"]
    p, q, key = toy.p[: K + 1], toy.q[:K], mx.random.key(11)
    drafts = [int(x) for x in np.array(q).argmax(axis=-1)]
    n, emitted = accept_drafts(p, drafts, q, key)
    n_rows, next_rows = accept_rows(p[None], mx.array([drafts]), q[None], key)
    assert n == n_rows.item() and emitted == drafts[:n] + [next_rows.item()]
    assert isinstance(n, int) and all(isinstance(t, int) for t in emitted)


def test_draft_equal_to_target_is_always_accepted():
    p = make_toy().p[: K + 1]
    for seed in range(20):
        n, emitted = accept_drafts(p, [1, 2, 3], p[:K], mx.random.key(seed))
        assert n == K and emitted[:K] == [1, 2, 3] and len(emitted) == K + 1


def test_draft_the_target_rules_out_is_rejected_and_never_re_emitted():
    p = mx.array([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    q = mx.array([[1.0, 0.0, 0.0, 0.0]])
    for seed in range(20):
        n, emitted = accept_drafts(p, [0], q, mx.random.key(seed))
        assert n == 0 and emitted[0] in (1, 2)
        n, emitted = accept_drafts(p, mx.array([3]), None, mx.random.key(seed))
        assert n == 0 and emitted[0] in (1, 2)


def test_deterministic_draft_with_certain_target_is_accepted():
    p = mx.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert accept_drafts(p, [1, 2], None, mx.random.key(0)) == (2, [1, 2, 0])


def test_no_drafts_samples_one_token_from_the_target():
    n, emitted = accept_drafts(mx.array([[0.0, 0.0, 1.0]]), [], None, mx.random.key(0))
    assert (n, emitted) == (0, [2])


def test_same_key_same_outcome():
    toy = TOYS["sampled q"]
    drafts = [0, 1, 2]
    p, q = toy.p[: K + 1], toy.q[:K]
    runs = {tuple(accept_drafts(p, drafts, q, mx.random.key(5))[1]) for _ in range(3)}
    assert len(runs) == 1


@pytest.mark.parametrize(
    "target, drafts, want",
    [
        ([5, 6, 7, 8], [5, 6, 7], (3, [5, 6, 7, 8])),  # all accepted, bonus
        ([5, 6, 7, 8], [5, 9, 7], (1, [5, 6])),  # mismatch at 1: the target's token there
        ([5, 6, 7, 8], [4, 6, 7], (0, [5])),  # first draft wrong
        ([5], [], (0, [5])),  # nothing drafted
        ([1, 1], [1], (1, [1, 1])),
    ],
)
def test_accept_greedy_exact(target, drafts, want):
    assert accept_greedy(target, drafts) == want
    assert accept_greedy(mx.array(target), mx.array(drafts, mx.int32)) == want


def test_mismatched_shapes_are_refused():
    p = make_toy().p
    with pytest.raises(ValueError):
        accept_drafts(p[:K], [0, 1, 2], None)  # needs K+1 target rows
    with pytest.raises(ValueError):
        accept_drafts(p[: K + 1], [0, 1, 2], p[: K + 1])  # needs K draft rows


def test_accept_greedy_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        accept_greedy([1, 2], [1, 2])
