"""MLX side of `metrale calibrate`: time verify(n, K) and draft(n, K). (Drafts' acceptance is
measured through the served scheduler: runtime/calibrate.py.)

verify(n, K) is one target forward over [n, K+1] tokens on a batch KV cache holding n identical
prompts (a fixed, realistic context): the K+1 new entries are trimmed after every timed call, so
every repeat sees the same context. K = 0 is the plain step. draft(n, K) is the drafter's work for
n sequences at depth K: n prompt lookups over a long history (n-gram, pure Python), or K head
forwards at width n (MTP). A width's cells are timed round-robin (each repeat visits every depth in
turn), so drift on a shared machine hits all depths alike instead of skewing one; each cell keeps
the median wall ms and the median joules of its repeats.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from kernels.features import body
from kernels.loader import output_head
from kernels.ngram import propose_ngram
from kernels.sampling import greedy_ids

Probe = Callable[[], object]  # one timed unit of work
Tick = Callable[[], None]  # progress: called once per timed call


@dataclass(frozen=True)
class Sample:
    """One cell's medians."""

    ms: float
    joules: float


class VerifyProbe:
    """n identical sequences of `context` tokens in one batch KV cache; verifies K drafts per row."""

    def __init__(self, model, n: int, context: Sequence[int], max_k: int):
        self.model, self.cache = model, make_prompt_cache(model)
        rows = mx.array([list(context)] * n, dtype=mx.uint32)
        model(rows, cache=self.cache)
        mx.eval([(c.keys, c.values) for c in self.cache])
        # Any ids do for the verified rows: cost depends on shapes, not on which tokens.
        self.drafts = mx.array([list(context[: max_k + 1])] * n, dtype=mx.uint32)

    def __call__(self, k: int) -> None:
        logits = self.model(self.drafts[:, : k + 1], cache=self.cache)
        greedy_ids(logits).tolist()  # as Engine.verify
        for c in self.cache:
            c.trim(k + 1)


class MtpDraftProbe:
    """The runtime's drafts for a width-n batch (MTPHead.draft for one sequence, draft_many for
    several: kernels/mtp_draft_many.py), each sequence on its own copy of a prefilled head cache,
    trimmed back after each call."""

    def __init__(self, head, target, n: int, context: Sequence[int]):
        from kernels.drafters import owned_caches

        self.n = n
        inner = target.model
        self.head, self.embed, self.norm = head, inner.embed_tokens, inner.norm
        self.lm_head = output_head(target)
        tokens = mx.array([list(context)], dtype=mx.int32)
        hidden = body(target, tokens, None, head.config.feature_layers)[1]  # what the runtime feeds it
        cache = head.make_cache()
        head.forward(hidden[:, :-1], tokens[:, 1:], self.embed, self.norm, cache)
        self.hidden, self.token = hidden[0, -1:], tokens[0, -1:]
        self.caches = [owned_caches(cache, head.make_cache) for _ in range(n)]
        mx.eval(self.hidden, [(c.keys, c.values) for caches in self.caches for c in caches])

    def __call__(self, k: int) -> None:
        from kernels.mtp_draft_many import DraftJob, batchable, draft_many

        if self.n == 1 or not batchable(self.head):  # as MtpDrafter.propose_many chooses
            for caches in self.caches:
                self.head.draft(self.hidden, self.token, k, self.embed, self.norm, self.lm_head, caches)
        else:
            draft_many(self.head, [DraftJob(self.hidden, self.token, k, caches) for caches in self.caches],
                       self.embed, self.norm, self.lm_head)
        for caches in self.caches:
            for c in caches:
                c.trim(1)  # the new exact pair (the draft trimmed its k-1 speculative positions)


def ngram_draft(history: Sequence[int], n: int) -> Callable[[int], None]:
    """n prompt lookups at depth k over the same history: the n-gram drafter's work for a batch."""
    tokens = list(history)

    def draft(k: int) -> None:
        for _ in range(n):
            propose_ngram(tokens, k)

    return draft


def median_cells(
    cells: dict[tuple[int, int], Probe], *, warmup: int, repeats: int, meter, tick: Tick
) -> dict[tuple[int, int], Sample]:
    """Median wall ms and joules per (width, depth) cell. Repeats go round-robin over one width's
    depths at a time: the planner compares depths at a width, so those share the same load."""
    out: dict[tuple[int, int], Sample] = {}
    for width in sorted({n for n, _ in cells}):
        row = {key: probe for key, probe in cells.items() if key[0] == width}
        out.update(_round_robin(row, warmup, repeats, meter, tick))
    return out


def _round_robin(cells: dict, warmup: int, repeats: int, meter, tick: Tick) -> dict:
    keys = list(cells)
    ms: dict = {key: [] for key in keys}
    joules: dict = {key: [] for key in keys}
    for round_ in range(warmup + repeats):
        shift = round_ % len(keys)
        for key in keys[shift:] + keys[:shift]:  # rotate so no cell always follows the same one
            before, started = meter.read(), time.perf_counter()
            cells[key]()
            elapsed = time.perf_counter() - started
            if round_ >= warmup:
                ms[key].append(elapsed * 1e3)
                joules[key].append(meter.read().since(before))
            tick()
    return {k: Sample(statistics.median(ms[k]), statistics.median(joules[k])) for k in keys}


def verify_cells(model, widths, depths, context, max_k) -> dict[tuple[int, int], Probe]:
    probes = {n: VerifyProbe(model, n, context, max_k) for n in widths}
    return {(n, k): _bind(probes[n], k) for n in widths for k in depths}


def draft_cells(drafter: str, model, head, widths, depths, context, history):
    """Probes for draft(n, K) at K >= 1 (depth 0 drafts nothing and costs nothing)."""
    if drafter == "ngram":
        probes = {n: ngram_draft(history, n) for n in widths}
    elif drafter == "mtp":
        probes = {n: MtpDraftProbe(head, model, n, context) for n in widths}
    else:
        raise ValueError(f"cannot calibrate drafter {drafter!r} (ngram or mtp)")
    return {(n, k): _bind(probes[n], k) for n in widths for k in depths if k > 0}


def _bind(probe, k: int) -> Probe:
    return lambda: probe(k)
