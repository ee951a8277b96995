"""Greedy decode in lockstep for `metrale bench planner`: every configuration on the same prompt at
once, each step timed and metered on its own.

On a shared machine, load changes over seconds; runs one after another would each meet different
load. Here each configuration is its own sequence in one engine, and the next step always goes to
the sequence with the fewest tokens so far, so all of them cross the same text at the same time and
see the same load. Lookahead is off for every configuration (plain decode included): an
asynchronous step would run inside another configuration's timed step. Prefill is not measured:
it is the same for every depth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import kernels  # noqa: F401  (BLAS before mlx)

from kernels.engine import Engine
from kernels.ngram import propose_ngram

Rows = Callable[[list[float], int], int]  # (confidences, drafts) -> how many to verify


@dataclass(frozen=True)
class Config:
    name: str
    depth: int  # drafts proposed per step (0: plain decode)
    rows: Rows | None = None  # the planner's per-step choice of drafts to verify; None: all


@dataclass
class Measured:
    tokens: list[int]
    decoded: int = 0  # tokens emitted after the prefill's first one (up to EOS / max_tokens)
    seconds: float = 0.0
    joules: float = 0.0
    drafted: list[int] = field(default_factory=list)  # drafts verified, by position
    accepted: list[int] = field(default_factory=list)  # of them accepted, by position


def lockstep(
    engine: Engine, ids: Sequence[int], configs: Sequence[Config], *, drafter: str, max_tokens: int,
    eos_ids, meter,
) -> dict[str, Measured]:
    """Decode `ids` once per configuration, stepping the one furthest behind (ties: list order)."""
    ids = list(ids)
    runs = {c.name: Measured([engine.prefill(c.name, ids, 0.0, 1.0, None, False)], drafted=[0] * c.depth,
                             accepted=[0] * c.depth) for c in configs}
    live = [c for c in configs if not _done(runs[c.name], max_tokens, eos_ids)]
    while live:
        config = min(live, key=lambda c: len(runs[c.name].tokens))
        run = runs[config.name]
        before, started = meter.read(), time.perf_counter()
        _step(engine, config, run, ids, drafter, max_tokens)
        run.seconds += time.perf_counter() - started
        run.joules += meter.read().since(before)
        if _done(run, max_tokens, eos_ids):
            live.remove(config)
    for config in configs:
        engine.release(config.name)
        _finish(runs[config.name], max_tokens, eos_ids)
    return runs


def _step(engine: Engine, config: Config, run: Measured, ids: list[int], drafter: str, max_tokens: int) -> None:
    want = min(config.depth, max_tokens - len(run.tokens) - 1)
    drafts, confidences = _drafts(engine, config.name, drafter, ids + run.tokens, want)
    if drafts and config.rows is not None:
        drafts = drafts[: config.rows(confidences, len(drafts))]
    if not drafts:
        run.tokens += engine.decode([config.name], [False])
        return
    n, emitted = engine.verify(config.name, drafts, False)
    engine.rollback(config.name, len(drafts), n, emitted)
    for position in range(len(drafts)):
        run.drafted[position] += 1
        run.accepted[position] += position < n
    run.tokens += emitted


def _drafts(engine: Engine, seq_id: str, drafter: str, history: list[int], want: int):
    if want < 1:
        return [], []
    if drafter == "ngram":
        return propose_ngram(history, want), []  # no confidences: the planner uses its prior
    return engine.propose(seq_id, want)


def _done(run: Measured, max_tokens: int, eos_ids) -> bool:
    return len(run.tokens) >= max_tokens or any(t in eos_ids for t in run.tokens)


def _finish(run: Measured, max_tokens: int, eos_ids) -> None:
    stop = next((i + 1 for i, t in enumerate(run.tokens) if t in eos_ids), len(run.tokens))
    run.tokens = run.tokens[: min(stop, max_tokens)]
    run.decoded = len(run.tokens) - 1
