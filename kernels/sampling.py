"""Token distributions and draws: temperature, top-p nucleus, categorical sampling, greedy.

Rows are the last axis, so every function works on one row [V] and on many rows [R, V] (or any
leading shape). The same `probs_from_logits` is applied to the target's logits (p) and to a
drafter's logits (q), so speculative acceptance compares distributions shaped the same way.
Results stay lazy `mx.array`s; callers decide when to evaluate and convert to Python.
"""

from __future__ import annotations

import math

import mlx.core as mx


def probs_from_logits(logits: mx.array, temperature: float, top_p: float = 1.0) -> mx.array:
    """Softmax at `temperature`, restricted to the top-p nucleus and renormalised.

    temperature <= 0 means greedy: a one-hot row at the argmax (the distribution greedy decoding
    samples from), so acceptance maths has one code path for every temperature.
    """
    logits = logits.astype(mx.float32)
    if temperature <= 0:
        return _one_hot_argmax(logits)
    probs = mx.softmax(logits / temperature, axis=-1)
    if top_p < 1.0:
        probs = _nucleus(probs, top_p)
    return probs


def _one_hot_argmax(logits: mx.array) -> mx.array:
    top = mx.argmax(logits, axis=-1, keepdims=True)
    return (mx.arange(logits.shape[-1]) == top).astype(mx.float32)


def _nucleus(probs: mx.array, top_p: float) -> mx.array:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, then renormalise."""
    descending = -mx.sort(-probs, axis=-1)
    mass_before = mx.cumsum(descending, axis=-1) - descending
    # A token is in the nucleus if the mass strictly above it is still short of top_p; the most
    # likely token always is. Ties with the smallest kept probability are all kept.
    kept = mass_before < top_p
    smallest_kept = mx.min(mx.where(kept, descending, mx.inf), axis=-1, keepdims=True)
    masked = mx.where(probs >= smallest_kept, probs, 0.0)
    return masked / mx.sum(masked, axis=-1, keepdims=True)


def sample(probs: mx.array, key: mx.array | None = None) -> mx.array:
    """One token id per row drawn from `probs` (int32, shape = probs.shape[:-1]); lazy."""
    # log(0) = -inf gives masked tokens exactly zero chance.
    return mx.random.categorical(mx.log(probs), axis=-1, key=key).astype(mx.int32)


def greedy_ids(logits: mx.array) -> mx.array:
    """Greedy decoding's token per row (uint32, shape = logits.shape[:-1]); lazy. The argmax of the
    log-probabilities is the argmax of the logits (a per-row constant moves no maximum), and every
    greedy path here (plain, verify, batch, prefill) takes it from the logits: the log-softmax's exp
    over the vocabulary cost 1.5 ms a row on MLX's CPU backend, ~3.5% of a plain step and twice that
    in a verify of one draft. (In float, subtracting the constant can at most merge two top logits
    into a tie; it is exact once the top logit is at least ln V, so mlx-lm's pick is the same.)"""
    return mx.argmax(logits, axis=-1)


def greedy(logits: mx.array) -> mx.array:
    """The argmax token id per row (int32, shape = logits.shape[:-1]); lazy."""
    return mx.argmax(logits, axis=-1).astype(mx.int32)


def top1_logprob(logits: mx.array) -> mx.array:
    """Log-probability of the most likely token per row at temperature 1: a drafter's confidence."""
    logits = logits.astype(mx.float32)
    return mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1)


def penalise(logits: mx.array, counts: mx.array, seen: mx.array | None, presence: float, frequency: float,
             repetition: float) -> mx.array:
    """Penalised logits, rows on the last axis (vLLM's order: repetition, then frequency and presence).

    counts [.., V]: each token's occurrences in the output so far; seen [.., V] (bool): tokens of the
    prompt or the output, for the repetition penalty (CTRL, Keskar et al. 2019): a seen token's
    positive logit is divided by it, a negative one multiplied. OpenAI's penalties subtract
    frequency * count and presence * [count > 0].
    """
    logits = logits.astype(mx.float32)
    if repetition != 1.0 and seen is not None:
        logits = mx.where(seen, mx.where(logits > 0, logits / repetition, logits * repetition), logits)
    if frequency:
        logits = logits - frequency * counts
    if presence:
        logits = logits - presence * (counts > 0)
    return logits


def token_logprobs(logits: mx.array, token_ids: list[int], top: int) -> list[tuple[int, float, list]]:
    """(token, log-probability, [(token, log-probability)] of the `top` most likely, best first) for
    each row of logits [R, V] and its token: the distribution at temperature 1; evaluates."""
    logprobs = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32), axis=-1, keepdims=True)
    ids = mx.array(token_ids, dtype=mx.int32)[:, None]
    chosen = mx.take_along_axis(logprobs, ids, axis=-1)[:, 0]
    if top > 0:
        best = mx.argpartition(-logprobs, kth=top - 1, axis=-1)[:, :top]
        best_lp = mx.take_along_axis(logprobs, best, axis=-1)
        mx.eval(chosen, best, best_lp)
        # A grammar masks tokens to -inf: those are no alternatives.
        tops = [sorted(((t, lp) for t, lp in zip(i, v) if lp > -math.inf), key=lambda pair: -pair[1])
                for i, v in zip(best.tolist(), best_lp.tolist())]
    else:
        tops = [[] for _ in token_ids]
    return [(t, lp, alts) for t, lp, alts in zip(token_ids, chosen.tolist(), tops)]
