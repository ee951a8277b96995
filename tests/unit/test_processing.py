"""Penalties and log-probabilities on tiny random models: the penalty maths against a plain-Python
reference (hypothesis), greedy output with penalties identical with and without speculation (serial
and batched), log-probabilities equal to the target's own forward over the emitted history, and
rejection sampling under penalties keeping the penalised target (chi-square, with a broken control)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.acceptance import accept_rows
from kernels.batch_engine import step_rows
from kernels.engine import Engine
from kernels.ngram import propose_ngram
from kernels.processing import ProcessSpec, position_counts
from kernels.sampling import penalise, sample
from tests.tiny import tiny_llama
from tests.unit.test_acceptance import chi_square_pvalue
from tests.unit.test_speculative_engine import PROMPTS, make_engine

N = 24
PENALTIES = ProcessSpec(presence=0.8, frequency=0.6, repetition=1.3)


def reference_penalty(logit: float, count: int, seen: bool, presence, frequency, repetition) -> float:
    if seen:
        logit = logit / repetition if logit > 0 else logit * repetition
    return logit - frequency * count - presence * (count > 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-20, 20), st.integers(0, 5), st.booleans()), min_size=1, max_size=12),
       st.floats(-2, 2), st.floats(-2, 2), st.floats(0.1, 3))
def test_penalise_matches_the_reference(cells, presence, frequency, repetition):
    logits, counts, seen = (list(c) for c in zip(*cells))
    seen = [s or c > 0 for s, c in zip(seen, counts)]  # an output token is always seen
    got = penalise(mx.array(logits), mx.array(counts, dtype=mx.float32), mx.array(seen), presence, frequency,
                   repetition).tolist()
    want = [reference_penalty(*cell, presence, frequency, repetition) for cell in zip(logits, counts, seen)]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-4)


def test_position_counts_add_the_earlier_drafts():
    counts = mx.array([1.0, 0, 0, 2])
    rows = position_counts(counts, mx.array([[2, 2, 0]]), 4)[0].tolist()
    assert rows == [[1, 0, 0, 2], [1, 0, 1, 2], [1, 0, 2, 2], [2, 0, 2, 2]]


def plain(model, prompt, spec, n=N, batched=False, temperature=0.0, seed=None):
    engine = Engine(model, batched=batched)
    engine.specs["p"] = spec
    out = [engine.prefill("p", prompt, temperature, 1.0, seed, True)]
    logprobs = engine.take_logprobs("p")
    while len(out) < n:
        out += engine.decode(["p"], [True])
        logprobs += engine.take_logprobs("p")
    return out, logprobs


def speculative(engine, kind, prompt, spec, k=3, temperature=0.0, seed=None):
    """Verify steps with plain steps (and their lookahead) mixed in; tokens and log-probabilities."""
    engine.specs["s"] = spec
    out = [engine.prefill("s", prompt, temperature, 1.0, seed, True)]
    logprobs = list(engine.take_logprobs("s"))
    step = 0
    while len(out) < N:
        step += 1
        drafts = [] if step % 3 == 0 else \
            propose_ngram(prompt + out, k) if kind == "ngram" else engine.propose("s", k)[0]
        if drafts:
            accepted, emitted = engine.verify("s", drafts, use_draft_probs=kind != "ngram")
            engine.rollback("s", len(drafts), accepted, emitted)
        else:
            emitted = engine.decode(["s"], [True])
        out += emitted
        logprobs += engine.take_logprobs("s")
    return out[:N], logprobs[:N]


@pytest.mark.parametrize("kind", ["ngram", "self-draft", "mtp"])
def test_greedy_with_penalties_equals_plain_decode_with_them(kind):
    model = tiny_llama(seed=4)
    for prompt in PROMPTS:
        want, _ = plain(model, prompt, PENALTIES)
        assert want != plain(model, prompt, ProcessSpec())[0]  # the penalties change the output
        assert speculative(make_engine(kind, model), kind, prompt, PENALTIES)[0] == want


@pytest.mark.parametrize("kind", ["ngram", "mtp"])
def test_batched_rows_with_penalties_equal_each_sequence_alone(kind):
    """mtp_batch: penalised and plain sequences step together (plain rows, verify rows, lookahead);
    each greedy output equals its plain decode alone."""
    model = tiny_llama(seed=4)
    engine = make_engine(kind, model, batched=True)
    specs = [PENALTIES, ProcessSpec(), ProcessSpec(presence=1.5, top_logprobs=2)]
    for i, spec in enumerate(specs):
        engine.specs[str(i)] = spec
    firsts, _ = engine.prefill_chunk([(str(i), p, 0.0, 1.0, None, True) for i, p in enumerate(PROMPTS)], None)
    outs = {s: [t] for s, t in firsts.items()}
    for step in range(N):
        if step % 3 == 2:
            for s, token in zip(list(outs), engine.decode(list(outs), [True] * 3)):
                outs[s].append(token)
            continue
        rows = [(s, [] if (int(s) + step) % 4 == 0 else propose_ngram(PROMPTS[int(s)] + out, 2) if kind == "ngram"
                 else engine.propose(s, 2)[0], kind != "ngram") for s, out in outs.items()]
        for (s, drafts, _), (accepted, emitted) in zip(rows, step_rows(engine, rows)):
            if drafts:
                engine.rollback(s, len(drafts), accepted, emitted)
            outs[s] += emitted
        engine.start_ahead(list(outs))
    for i, spec in enumerate(specs):
        want, _ = plain(model, PROMPTS[i], spec, n=len(outs[str(i)]))
        assert outs[str(i)] == want, i


def forward_logprobs(model, prompt, out, spec=ProcessSpec()):
    """log-softmax of the target's logits at each emitted position, from one forward over the history."""
    history = mx.array(prompt + out, dtype=mx.uint32)
    logits = model(history[None])[0, len(prompt) - 1:-1]
    return (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).tolist()


@pytest.mark.parametrize("kind", ["ngram", "mtp"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_targets_with_and_without_speculation(kind, temperature):
    model = tiny_llama(seed=4)
    spec = ProcessSpec(top_logprobs=3)
    prompt = PROMPTS[1]
    runs = [plain(model, prompt, spec, temperature=temperature, seed=3),
            speculative(make_engine(kind, model), kind, prompt, spec, temperature=temperature, seed=3)]
    for out, logprobs in runs:
        assert [t for t, _, _ in logprobs] == out
        full = forward_logprobs(model, prompt, out)
        for (token, lp, top), row in zip(logprobs, full):
            assert lp == pytest.approx(row[token], abs=1e-4)
            best = sorted(range(len(row)), key=lambda i: -row[i])[:3]
            assert [i for i, _ in top] == best
            assert [v for _, v in top] == pytest.approx([row[i] for i in best], abs=1e-4)
    if temperature == 0:
        (plain_out, plain_lp), (spec_out, spec_lp) = runs
        assert spec_out == plain_out
        assert [lp for _, lp, _ in spec_lp] == pytest.approx([lp for _, lp, _ in plain_lp], abs=1e-4)


# --- rejection sampling under penalties keeps the penalised target ----------------------------------

VOCAB, SAMPLES = 8, 20_000
PRESENCE, FREQUENCY = 1.5, 0.5


def _rows(counts: mx.array, drafts: mx.array, logits: mx.array, per_position: bool) -> mx.array:
    """The penalised target's two rows per sample; the broken control counts no drafts."""
    rows = position_counts(counts, drafts, 2) if per_position else mx.broadcast_to(counts, (drafts.shape[0], 2, VOCAB))
    return mx.softmax(penalise(logits, rows, None, PRESENCE, FREQUENCY, 1.0), axis=-1)


def second_tokens(per_position: bool, seed: int = 1) -> tuple[np.ndarray, mx.array]:
    """One-draft speculative steps at temperature 1 from committed counts; the second emitted token of
    each, and its exact distribution under the penalised target (sum over x of p0(x) p1(. | x))."""
    k_logits, k_draft, k_rule, k_next = mx.random.split(mx.random.key(seed), 4)
    logits = mx.random.normal((2, VOCAB), key=k_logits)
    counts = mx.array([2.0, 0, 1, 0, 0, 3, 0, 0])
    q = mx.broadcast_to(mx.softmax(logits[0] + 0.7, axis=-1)[None, None], (SAMPLES, 1, VOCAB))
    drafts = sample(q, k_draft)
    n, bonus = accept_rows(_rows(counts, drafts, logits, per_position), drafts, q, k_rule)
    first = mx.where(n >= 1, drafts[:, 0], bonus)
    # A rejected draft emitted one token: the next plain step samples after it, counts updated.
    after_first = _rows(counts, first[:, None], logits, True)[:, 1]
    second = mx.where(n >= 1, bonus, sample(after_first, k_next))
    p0 = mx.softmax(penalise(logits[0], counts, None, PRESENCE, FREQUENCY, 1.0))
    p1 = _rows(counts, mx.arange(VOCAB)[:, None], logits, True)[:, 1]  # [x, V]
    return np.array(second), (p0[:, None] * p1).sum(axis=0)


def test_rejection_sampling_under_penalties_keeps_the_penalised_target():
    tokens, expected = second_tokens(per_position=True)
    assert chi_square_pvalue(tokens, expected) > 1e-3
    broken, expected = second_tokens(per_position=False)  # the bonus row blind to the accepted draft
    assert chi_square_pvalue(broken, expected) < 1e-6
    assert not math.isnan(float(expected.sum()))
