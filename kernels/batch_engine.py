"""Batched steps for mtp_batch: one target forward over every sequence of the running batch.

The batch keeps one left-padded BatchKVCache per layer (mlx-lm's layout: every row ends at the same
index). A step feeds each row its last token plus its drafts, right-padded to the longest row.
Rows then shed different numbers of entries (padding, rejected drafts): a ragged rollback, done as
one trim by the common part and one per-row roll of the rest into the left padding.
Sequences are prefilled alone and join the batch at its next step; ended ones are filtered out.
"""

from __future__ import annotations

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from kernels.acceptance import accept_drafts, accept_greedy
from kernels.loader import output_head
from kernels.sampling import probs_from_logits, sample


class Batch:
    def __init__(self):
        self.ids: list[str] = []
        self.cache: list[BatchKVCache] | None = None
        self.incoming: list[tuple[list[str], list[BatchKVCache]]] = []  # prefilled together, not joined yet

    def sync(self, engine, seq_ids: list[str]) -> None:
        """Apply pending rollbacks, drop rows not asked for, add newly prefilled sequences."""
        self._roll_back(engine)
        for ids, cache in self.incoming:
            self._join(ids, cache)
        self.incoming = []
        wanted = set(seq_ids)
        keep = [i for i, s in enumerate(self.ids) if s in wanted]
        if len(keep) < len(self.ids):
            self.ids = [self.ids[i] for i in keep]
            if not keep:
                self.cache = None
            else:
                for c in self.cache:
                    c.filter(mx.array(keep))
        new = [s for s in seq_ids if s not in self.ids]
        if new:  # prefilled alone, each with its own cache
            layers = len(engine.seqs[new[0]].cache)
            self._join(new, [BatchKVCache.merge([engine.seqs[s].cache[i] for s in new]) for i in range(layers)])
            for s in new:
                engine.seqs[s].cache = None  # the batch owns its entries now

    def _join(self, ids: list[str], cache: list[BatchKVCache]) -> None:
        if self.cache is None:
            self.cache = cache
        else:
            for c, other in zip(self.cache, cache):
                c.extend(other)
        self.ids += ids

    def _roll_back(self, engine) -> None:
        trims = [engine.seqs[s].pending_trim if s in engine.seqs else 0 for s in self.ids]
        if not self.cache or not any(trims):
            return
        common = min(trims)
        for c in self.cache:
            if common:
                c.trim(common)
            if max(trims) > common:
                c.prepare(right_padding=[t - common for t in trims])
                c.finalize()
        for s in self.ids:
            if s in engine.seqs:
                engine.seqs[s].pending_trim = 0


def step_rows(engine, rows: list[tuple[str, list[int], bool]]) -> list[tuple[int, list[int]]]:
    """rows: (seq_id, drafts, use_draft_probs); no drafts = a plain row. Returns (accepted, emitted)
    per row. Rows with drafts are rolled back when engine.rollback reports their acceptance."""
    batch = engine.batch
    batch.sync(engine, [seq_id for seq_id, _, _ in rows])
    by_id = {seq_id: (drafts, use_q) for seq_id, drafts, use_q in rows}
    states = [engine.seqs[s] for s in batch.ids]
    width = 1 + max(len(drafts) for drafts, _ in by_id.values())
    inputs = [_row_tokens(state, by_id[s][0], width) for s, state in zip(batch.ids, states)]
    hidden = engine.model.model(mx.stack(inputs), cache=batch.cache)
    logits = output_head(engine.model)(hidden)
    greedy = mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)
    mx.eval(greedy)
    greedy_rows = greedy.tolist()
    results = {}
    for b, (seq_id, state) in enumerate(zip(batch.ids, states)):
        drafts, use_q = by_id[seq_id]
        used = len(drafts) + 1
        state.length += used
        state.pending_trim = width - used  # the padding goes at the next sync
        if engine.drafter is not None:
            row_hidden, row_tokens = hidden[b, :used], inputs[b][:used]
            engine.drafter.verified(state, row_hidden) if drafts else engine.drafter.fed(state, row_tokens, row_hidden)
        results[seq_id] = _accept(state, logits[b, :used], greedy_rows[b][:used], drafts, use_q)
    return [results[seq_id] for seq_id, _, _ in rows]


def _row_tokens(state, drafts: list[int], width: int) -> mx.array:
    last = state.last.astype(mx.uint32).reshape(-1)
    pad = width - 1 - len(drafts)
    return mx.concatenate([last, mx.array(drafts + [0] * pad, dtype=mx.uint32)]) if width > 1 else last


def _accept(state, logits: mx.array, greedy_ids: list[int], drafts: list[int], use_q: bool):
    if state.temperature == 0:
        accepted, emitted = accept_greedy(greedy_ids, drafts)
    elif drafts:
        p = probs_from_logits(logits, state.temperature, state.top_p)
        q = state.draft_probs[:len(drafts)] if use_q else None  # the planner may verify fewer
        accepted, emitted = accept_drafts(p, drafts, q, state.next_key())
    else:
        token = sample(probs_from_logits(logits[-1], state.temperature, state.top_p), state.next_key())
        accepted, emitted = 0, [int(token.item())]
    if not drafts:
        state.last = mx.array(emitted, dtype=mx.uint32)
    return accepted, emitted
