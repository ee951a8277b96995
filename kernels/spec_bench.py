"""Greedy generation loops for `metrale bench spec`: plain decode and the speculative step, timed."""

from __future__ import annotations

import time

import kernels  # noqa: F401  (BLAS before mlx)

from kernels.engine import Engine
from kernels.ngram import propose_ngram


class Run:
    def __init__(self, tokens: list[int], seconds: float, drafted: list[int], accepted: list[int]):
        self.tokens, self.seconds, self.drafted, self.accepted = tokens, seconds, drafted, accepted


def generate(engine: Engine, ids: list[int], max_tokens: int, kind: str, k: int, eos_ids) -> Run:
    """kind "plain" decodes with lookahead; "ngram" and model drafters speculate at depth k."""
    drafted, accepted = [0] * k, [0] * k
    started = time.perf_counter()
    out = [engine.prefill("b", ids, 0.0, 1.0, None, kind == "plain")]
    while len(out) < max_tokens and out[-1] not in eos_ids:
        want = min(k, max_tokens - len(out) - 1)
        drafts = [] if kind == "plain" or want < 1 else (
            propose_ngram(ids + out, want) if kind == "ngram" else engine.propose("b", want)[0])
        if not drafts:
            out += engine.decode(["b"], [kind == "plain"])
            continue
        n, emitted = engine.verify("b", drafts, kind != "ngram")
        engine.rollback("b", len(drafts), n, emitted)
        for position in range(len(drafts)):
            drafted[position] += 1
            accepted[position] += position < n
        out += emitted
    seconds = time.perf_counter() - started
    engine.release("b")
    stop = next((i for i, t in enumerate(out) if t in eos_ids), len(out))
    return Run(out[:min(stop, max_tokens)], seconds, drafted, accepted)
