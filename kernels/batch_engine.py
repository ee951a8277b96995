"""Batched steps for mtp_batch: one target forward over every sequence of the running batch.

The batch keeps one left-padded BatchKVCache per layer (mlx-lm's layout: every row ends at the same
index). A step feeds each row its last token plus its drafts, right-padded to the longest row.
Rows then shed different numbers of entries (padding, rejected drafts): a ragged rollback, done as
one trim by the common part and one per-row roll of the rest into the left padding.
Sequences are prefilled alone and join the batch at its next step; ended ones are filtered out.

Lookahead (plain steps, and after a verify whose next step is plain): the next plain step is started
once this step's tokens are read, and computes while the scheduler streams them. It is used if the next
call asks for the same rows (or some of them) with nobody joining; otherwise it is dropped: one
trim of the batch cache, and each row's last token, random key and drafter feed put back.
"""

from __future__ import annotations

from typing import NamedTuple

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from kernels import rows_matmul
from kernels.acceptance import accept_drafts, accept_greedy
from kernels.features import body
from kernels.loader import output_head
from kernels.processing import blocks_lookahead, commit, note, processed
from kernels.sampling import greedy_ids, probs_from_logits, sample


class Ahead(NamedTuple):
    ids: list[str]  # the batch's rows when it was built
    tokens: mx.array  # [rows], computing once started
    saved: dict[str, tuple]  # per row: (last, key, counts) before the step, to put back if it is dropped
    started: bool = True


class Batch:
    def __init__(self):
        self.ids: list[str] = []
        self.cache: list[BatchKVCache] | None = None
        self.incoming: list[tuple[list[str], list[BatchKVCache]]] = []  # prefilled together, not joined yet
        self.prefilling = None  # a PrefillGroup part-way through a chunked prefill
        self.ahead: Ahead | None = None

    def take_ahead(self, seq_ids) -> tuple[list[str], mx.array] | None:
        """(rows, tokens still computing) of the lookahead step, if it is this step: the same rows
        or some of them (others left), nobody joining."""
        ahead = self.ahead
        if ahead is None or self.incoming or not set(seq_ids) <= set(ahead.ids):
            return None
        self.ahead = None
        return ahead.ids, ahead.tokens

    def drop_ahead(self, engine) -> None:
        """Undo a lookahead step nobody will use: its cache entry, and each row's state."""
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return
        mx.eval(ahead.tokens)  # let it finish before its cache entries go
        for c in self.cache:
            c.trim(1)
        for seq_id in ahead.ids:
            state = engine.seqs.get(seq_id)
            if state is None:
                continue
            state.last, state.key, counts = ahead.saved[seq_id]
            if state.proc is not None:
                state.proc.restore(counts)
            state.length -= 1
            if (drafter := engine.drafter_of(state)) is not None:
                drafter.undo_feed(state)

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
                realign(c, [t - common for t in trims])
        for s in self.ids:
            if s in engine.seqs:
                engine.seqs[s].pending_trim = 0


def realign(cache, shifts: list[int]) -> None:
    """After a ragged trim, every row ends at the write head again (row b moved right by shifts[b], its
    front left padding): the kernel's shift of the shifted rows alone, in place where the buffer is not
    shared, else mlx-lm's roll, which gathers the whole buffer (at width 4 and a few hundred tokens of
    context it cost 73-89 ms over the 30 layers on a 2-core AMD EPYC, more than a plain step)."""
    module = rows_matmul.load()
    if module is None or type(cache) is not BatchKVCache or cache.keys is None:
        cache.prepare(right_padding=shifts)
        cache.finalize()
        return
    cache.keys = module.shift_rows(cache.keys, shifts, cache._idx)
    cache.values = module.shift_rows(cache.values, shifts, cache._idx)
    moved = mx.array(shifts)
    cache.offset = cache.offset - moved  # as mlx-lm's finalize: the row's entries are `moved` fewer
    cache.left_padding = cache.left_padding + moved


def step_rows(engine, rows: list[tuple[str, list[int], bool]]) -> list[tuple[int, list[int]]]:
    """rows: (seq_id, drafts, use_draft_probs); no drafts = a plain row. Returns (accepted, emitted)
    per row. Rows with drafts are rolled back when engine.rollback reports their acceptance."""
    batch = engine.batch
    batch.drop_ahead(engine)
    batch.sync(engine, [seq_id for seq_id, _, _ in rows])
    by_id = {seq_id: (drafts, use_q) for seq_id, drafts, use_q in rows}
    states = [engine.seqs[s] for s in batch.ids]
    width = 1 + max(len(drafts) for drafts, _ in by_id.values())
    inputs = [_row_tokens(state, by_id[s][0], width) for s, state in zip(batch.ids, states)]
    final, hidden = _body(engine, mx.stack(inputs), batch.cache)
    logits = output_head(engine.model)(final)
    greedy = greedy_ids(logits)
    mx.eval(greedy)
    greedy_rows = greedy.tolist()
    results = {}
    for b, (seq_id, state) in enumerate(zip(batch.ids, states)):
        drafts, use_q = by_id[seq_id]
        used = len(drafts) + 1
        state.length += used
        state.pending_trim = width - used  # the padding goes at the next sync
        drafter = engine.drafter_of(state)
        if drafter is not None:
            row_hidden, row_tokens = hidden[b, :used], inputs[b][:used]
            drafter.verified(state, row_hidden) if drafts else drafter.fed(state, row_tokens, row_hidden)
        results[seq_id] = _accept(state, logits[b, :used], greedy_rows[b][:used], drafts, use_q)
    return [results[seq_id] for seq_id, _, _ in rows]


def plain_rows(engine, seq_ids: list[str], ahead: list[str], launch: bool = True) -> list[int]:
    """One plain step for every sequence (tokens in seq_ids order). The next plain step of the
    `ahead` rows is built once this one's tokens are read, and started unless launch is False
    (start_ahead starts it)."""
    batch = engine.batch
    taken = batch.take_ahead(seq_ids)
    if taken is None:
        batch.drop_ahead(engine)
        step = _plain_forward(engine, seq_ids)
        rows = list(batch.ids)
    else:
        rows, step = taken
    values = dict(zip(rows, step.tolist()))
    for s in seq_ids:  # before the next step's start replaces each row's logits
        state = engine.seqs[s]
        if state.proc is not None:
            note(state, state.step_logits, [values[s]])
    if ahead and not batch.incoming:  # after reading; nobody joining (a join drops it)
        _start(engine, ahead, launch)
    return [values[s] for s in seq_ids]


def start_ahead(engine, seq_ids: list[str]) -> None:
    """Start the next plain step of these rows: the one a plain step built for them, or, after a
    verify step, a new one (their rollbacks applied first)."""
    built = engine.batch.ahead
    if built is not None and not built.started and set(built.ids) == set(seq_ids):
        mx.async_eval(built.tokens)
        engine.batch.ahead = built._replace(started=True)
        return
    engine.batch.drop_ahead(engine)
    if engine.batch.incoming or not all(s in engine.seqs for s in seq_ids):
        return  # someone joins at the next step: it will not be this one
    _start(engine, seq_ids)


def _start(engine, seq_ids: list[str], launch: bool = True) -> None:
    if any(blocks_lookahead(engine.seqs[s]) for s in seq_ids):
        return  # a grammar's next mask needs this step's tokens read first
    saved = {s: (engine.seqs[s].last, engine.seqs[s].key,
                 engine.seqs[s].proc and engine.seqs[s].proc.snapshot()) for s in seq_ids}
    following = _plain_forward(engine, seq_ids)
    if launch:
        mx.async_eval(following)
    engine.batch.ahead = Ahead(list(engine.batch.ids), following, saved, started=launch)


def _plain_forward(engine, seq_ids: list[str]) -> mx.array:
    """Lazy: one plain step of the batch (rows in batch order); each row's `last` becomes its
    new token, still computing."""
    batch = engine.batch
    batch.sync(engine, seq_ids)
    states = [engine.seqs[s] for s in batch.ids]
    inputs = mx.stack([state.last.astype(mx.uint32).reshape(-1) for state in states])
    final, hidden = _body(engine, inputs, batch.cache)
    logits = output_head(engine.model)(final)[:, -1]
    greedy = greedy_ids(logits)
    fed = _fed_rows(engine, states, inputs, hidden)
    tokens = []
    for b, state in enumerate(states):
        row = processed(state, logits[b:b + 1])
        state.step_logits = row if state.proc is not None else None
        if state.temperature == 0:
            token = greedy[b:b + 1] if state.proc is None else \
                greedy_ids(row)
        else:
            token = sample(probs_from_logits(row[0], state.temperature, state.top_p), state.next_key()).reshape(1)
        state.last = token.astype(mx.uint32)
        commit(state, state.last)
        state.length += 1
        if fed is not None and (drafter := engine.drafter_of(state)) is not None:
            drafter.fed(state, *fed[b])
        tokens.append(token.astype(mx.uint32))
    return mx.concatenate(tokens)


def _fed_rows(engine, states, inputs: mx.array, hidden: mx.array) -> list[tuple[mx.array, mx.array]] | None:
    """Each row's (token, hidden row) for its drafter, split in one op each: a drafter keeps them
    lazy until its head absorbs 63 of them, and a slice per row and step made that absorb evaluate
    hundreds of tiny ops (~2-3 ms a sequence, 8 sequences)."""
    if not any(engine.drafter_of(state) is not None for state in states):
        return None
    n = len(states)  # one position a row: a token [1] and its hidden row [1, F]
    return list(zip(mx.split(inputs.reshape(n), n), mx.split(hidden.reshape(n, hidden.shape[-1]), n)))


def _body(engine, tokens: mx.array, cache) -> tuple[mx.array, mx.array]:
    """(final hidden, the drafter's features): the layers its head reads come from this forward."""
    layers = engine.drafter.feature_layers if engine.drafter is not None else ()
    return body(engine.model, tokens, cache, layers)


def _row_tokens(state, drafts: list[int], width: int) -> mx.array:
    last = state.last.astype(mx.uint32).reshape(-1)
    pad = width - 1 - len(drafts)
    return mx.concatenate([last, mx.array(drafts + [0] * pad, dtype=mx.uint32)]) if width > 1 else last


def _accept(state, logits: mx.array, greedy_row: list[int], drafts: list[int], use_q: bool):
    if state.proc is not None:  # the penalised target: each row with the counts as of its position
        logits = processed(state, logits, drafts)
        if state.temperature == 0:
            greedy_row = greedy_ids(logits).tolist()
    if state.temperature == 0:
        accepted, emitted = accept_greedy(greedy_row, drafts)
    elif drafts:
        p = probs_from_logits(logits, state.temperature, state.top_p)
        q = state.draft_probs[:len(drafts)] if use_q else None  # the planner may verify fewer
        accepted, emitted = accept_drafts(p, drafts, q, state.next_key())
    else:
        token = sample(probs_from_logits(logits[-1], state.temperature, state.top_p), state.next_key())
        accepted, emitted = 0, [int(token.item())]
    if not drafts:
        state.last = mx.array(emitted, dtype=mx.uint32)
        commit(state, emitted)
    note(state, logits, emitted)
    return accepted, emitted
