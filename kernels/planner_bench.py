"""Greedy decode in lockstep for `metrale bench planner`: every configuration on the same prompts at
once, each step timed and metered on its own.

On a shared machine, load changes over seconds; runs one after another would each meet different
load. Here each configuration is its own group of sequences (one per prompt: the batch width), and
the next step always goes to the group with the fewest tokens so far, so all groups cross the same
text at the same time and see the same load. Width 1 steps through the serial engine; wider groups
step as one batch (kernels/batch_engine.py, the mtp_batch path), each in its own engine. Lookahead
is off everywhere (plain decode included): an asynchronous step would run inside another group's
timed step. Prefill is not measured: it is the same for every depth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import kernels  # noqa: F401  (BLAS before mlx)

from kernels.batch_engine import step_rows
from kernels.engine import Engine
from kernels.ngram import propose_ngram

# (confidences per sequence, drafts per sequence) -> drafts to verify per sequence
Rows = Callable[[list[list[float]], list[int]], Sequence[int]]


@dataclass(frozen=True)
class Config:
    name: str
    depth: int  # drafts proposed per sequence and step (0: plain decode)
    rows: Rows | None = None  # the planner's per-step choice of drafts to verify; None: all


@dataclass
class Measured:
    """One configuration's group, summed over its sequences."""

    tokens: list[list[int]]  # per sequence
    decoded: int = 0  # tokens emitted after each prefill's first one (up to EOS / max_tokens)
    seconds: float = 0.0
    joules: float = 0.0
    drafted: list[int] = field(default_factory=list)  # drafts verified, by position
    accepted: list[int] = field(default_factory=list)  # of them accepted, by position


@dataclass
class _Group:
    config: Config
    engine: Engine
    ids: list[str]
    run: Measured


def lockstep(
    model, prompts: Sequence[Sequence[int]], configs: Sequence[Config], *, drafter, drafter_kind: str,
    max_tokens: int, eos_ids, meter,
) -> dict[str, Measured]:
    """Decode the prompts (one sequence each) once per configuration, stepping the group furthest
    behind (ties: list order). drafter is the engine-side drafter (None for n-gram)."""
    groups = [_open(model, prompts, c, drafter) for c in configs]
    live = [g for g in groups if _live(g, max_tokens, eos_ids)]
    while live:
        group = min(live, key=lambda g: sum(map(len, g.run.tokens)))
        before, started = meter.read(), time.perf_counter()
        _step(group, prompts, drafter_kind, max_tokens, eos_ids)
        group.run.seconds += time.perf_counter() - started
        group.run.joules += meter.read().since(before)
        if not _live(group, max_tokens, eos_ids):
            live.remove(group)
    return {g.config.name: _finish(g, max_tokens, eos_ids) for g in groups}


def _open(model, prompts, config: Config, drafter) -> _Group:
    engine = Engine(model, drafter=drafter, batched=len(prompts) > 1)
    ids = [f"{config.name}/{i}" for i in range(len(prompts))]
    first = [[engine.prefill(s, list(p), 0.0, 1.0, None, False)] for s, p in zip(ids, prompts)]
    return _Group(config, engine, ids, Measured(first, drafted=[0] * config.depth, accepted=[0] * config.depth))


def _step(group: _Group, prompts, drafter_kind: str, max_tokens: int, eos_ids) -> None:
    engine, run, config = group.engine, group.run, group.config
    live = [i for i, out in enumerate(run.tokens) if not _done(out, max_tokens, eos_ids)]
    proposed = [_drafts(engine, group.ids[i], drafter_kind, list(prompts[i]) + run.tokens[i],
                        min(config.depth, max_tokens - len(run.tokens[i]) - 1)) for i in live]
    drafts = [d for d, _ in proposed]
    if config.rows is not None and any(drafts):
        keep = config.rows([c for _, c in proposed], [len(d) for d in drafts])
        drafts = [d[:k] for d, k in zip(drafts, keep)]
    if engine.batch is None:  # width 1: the serial engine's own calls
        results = [engine.verify(group.ids[live[0]], drafts[0], False) if drafts[0]
                   else (0, engine.decode([group.ids[live[0]]], [False]))]
    else:
        results = step_rows(engine, [(group.ids[i], d, False) for i, d in zip(live, drafts)])
    for i, d, (n, emitted) in zip(live, drafts, results):
        if d:
            engine.rollback(group.ids[i], len(d), n, emitted)
            for position in range(len(d)):
                run.drafted[position] += 1
                run.accepted[position] += position < n
        run.tokens[i] += emitted


def _drafts(engine: Engine, seq_id: str, drafter_kind: str, history: list[int], want: int):
    if want < 1:
        return [], []
    if drafter_kind == "ngram":
        return propose_ngram(history, want), []  # no confidences: the planner uses its prior
    return engine.propose(seq_id, want)


def _done(out: list[int], max_tokens: int, eos_ids) -> bool:
    return len(out) >= max_tokens or any(t in eos_ids for t in out)


def _live(group: _Group, max_tokens: int, eos_ids) -> bool:
    return any(not _done(out, max_tokens, eos_ids) for out in group.run.tokens)


def _finish(group: _Group, max_tokens: int, eos_ids) -> Measured:
    run = group.run
    for i, out in enumerate(run.tokens):
        stop = next((j + 1 for j, t in enumerate(out) if t in eos_ids), len(out))
        run.tokens[i] = out[: min(stop, max_tokens)]
        group.engine.release(group.ids[i])
    run.decoded = sum(len(out) - 1 for out in run.tokens)
    return run
