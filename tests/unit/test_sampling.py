"""Temperature, top-p, sampling and greedy on one row and on many rows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from hypothesis import given, settings, strategies as st

from kernels.sampling import greedy, greedy_ids, probs_from_logits, sample, top1_logprob


def _logits(rows: int = 4, vocab: int = 16, seed: int = 0) -> mx.array:
    return mx.random.normal((rows, vocab), key=mx.random.key(seed)) * 2.0


def _numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_softmax_matches_numpy(temperature):
    logits = _logits()
    got = np.array(probs_from_logits(logits, temperature))
    want = _numpy_softmax(np.array(logits) / temperature)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_one_row_and_many_rows_agree():
    logits = _logits()
    many = probs_from_logits(logits, 0.8, 0.7)
    for row in range(logits.shape[0]):
        one = probs_from_logits(logits[row], 0.8, 0.7)
        assert one.shape == (logits.shape[1],)
        np.testing.assert_allclose(np.array(one), np.array(many[row]), atol=1e-6)


def test_temperature_zero_is_one_hot_at_argmax():
    logits = _logits()
    probs = np.array(probs_from_logits(logits, 0.0, 0.5))
    assert (probs.sum(axis=-1) == 1).all()
    assert (probs.argmax(axis=-1) == np.array(logits).argmax(axis=-1)).all()
    assert set(np.unique(probs)) == {0.0, 1.0}


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.6, 0.9, 0.999])
def test_top_p_keeps_the_smallest_nucleus_reaching_p(top_p):
    logits = _logits(rows=6, vocab=32, seed=3)
    full = np.array(probs_from_logits(logits, 1.0))
    kept = np.array(probs_from_logits(logits, 1.0, top_p))
    for row_full, row_kept in zip(full, kept):
        order = np.argsort(-row_full)
        mass_before = np.cumsum(row_full[order]) - row_full[order]
        want_kept = set(order[mass_before < top_p].tolist())
        assert set(np.nonzero(row_kept)[0].tolist()) == want_kept
        np.testing.assert_allclose(row_kept.sum(), 1.0, rtol=1e-5)
        # Renormalised, not reshaped: kept tokens keep their relative odds.
        idx = sorted(want_kept)
        np.testing.assert_allclose(row_kept[idx], row_full[idx] / row_full[idx].sum(), rtol=1e-4)


def test_top_p_one_changes_nothing():
    logits = _logits()
    np.testing.assert_allclose(
        np.array(probs_from_logits(logits, 0.7, 1.0)), np.array(mx.softmax(logits / 0.7, axis=-1))
    )


def test_sample_is_seeded_and_never_draws_masked_tokens():
    probs = probs_from_logits(_logits(rows=1, vocab=16)[0], 1.0, 0.5)
    batch = mx.broadcast_to(probs, (5000, 16))
    first, again = sample(batch, mx.random.key(7)), sample(batch, mx.random.key(7))
    assert first.dtype == mx.int32 and first.shape == (5000,)
    assert mx.array_equal(first, again)
    drawn = set(np.unique(np.array(first)).tolist())
    assert drawn <= set(np.nonzero(np.array(probs))[0].tolist())


def test_sample_frequencies_follow_probs():
    probs = mx.array([0.1, 0.2, 0.3, 0.4])
    draws = np.array(sample(mx.broadcast_to(probs, (40000, 4)), mx.random.key(1)))
    freq = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(freq, np.array(probs), atol=0.01)


def test_sample_one_row_returns_a_scalar():
    token = sample(mx.array([0.0, 0.0, 1.0]), mx.random.key(0))
    assert token.shape == () and token.item() == 2


def test_greedy_and_top1_logprob():
    logits = _logits()
    assert np.array_equal(np.array(greedy(logits)), np.array(logits).argmax(axis=-1))
    assert greedy(logits[0]).shape == ()
    want = np.log(_numpy_softmax(np.array(logits)).max(axis=-1))
    np.testing.assert_allclose(np.array(top1_logprob(logits)), want, rtol=1e-5)


def _old_greedy(logits: mx.array) -> mx.array:
    """What every greedy path took before (mlx-lm's pick): the argmax of the log-probabilities."""
    return mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 5), vocab=st.sampled_from([2, 7, 500, 49152]),
       scale=st.floats(0.01, 40.0), top=st.floats(0.0, 60.0), tie=st.booleans())
def test_greedy_ids_is_the_log_softmax_argmax_once_the_top_logit_reaches_ln_v(seed, rows, vocab, scale, top, tie):
    """The claim greedy_ids rests on: with the top logit >= ln V, subtracting logsumexp (exact there)
    moves no maximum, near-ties one ulp apart included: the same token as mlx-lm's greedy pick."""
    logits = mx.random.normal((rows, vocab), key=mx.random.key(seed)) * scale
    logits = logits - logits.max(axis=-1, keepdims=True) + max(top, float(np.log(vocab)))
    if tie:  # a runner-up one ulp below the top, before it in the row: where a rounding would show
        arr = np.array(logits)
        for row in arr:
            best = int(row.argmax())
            if best > 0:
                row[best - 1] = np.nextafter(row[best], -np.inf, dtype=np.float32)
        logits = mx.array(arr)
    assert greedy_ids(logits).tolist() == _old_greedy(logits).tolist()


def test_greedy_ids_of_a_verify_row_is_that_row_alone():
    logits = _logits(rows=6, vocab=300, seed=3)
    together = greedy_ids(logits).tolist()
    assert together == [greedy_ids(logits[i]).item() for i in range(6)]
    assert greedy_ids(logits).dtype == mx.uint32
