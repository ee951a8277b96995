"""Prefill several new sequences together (mtp_batch): prompts left-padded into a fresh batch cache,
which joins the running batch at its next step. Mirrors mlx-lm's batched prefill.

A group may prefill over several steps (chunked prefill): each call runs at most a budget of padded
tokens, so the running batch's next decode step waits for one chunk, not for the whole group.
"""

from __future__ import annotations

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from kernels.features import body
from kernels.loader import output_head
from kernels.processing import commit, note, processed
from kernels.sampling import probs_from_logits, sample


class PrefillGroup:
    """Sequences prefilling together: their left-padded prompts, batch cache and progress."""

    def __init__(self, engine, items: list[tuple[str, list[int], float, float, int | None, bool, str | None]]):
        from kernels.engine import SeqState, _fresh_seed

        lengths = [len(ids) for _, ids, *_ in items]
        self.ids = [seq_id for seq_id, *_ in items]
        self.width, self.done = max(lengths), 0
        self.pads = [self.width - n for n in lengths]
        self.tokens = mx.array([[0] * pad + list(ids) for pad, (_, ids, *_) in zip(self.pads, items)],
                               dtype=mx.uint32)
        self.cache = [BatchKVCache(self.pads) for _ in engine.model.model.layers]
        self.states = []
        for (seq_id, ids, temperature, top_p, seed, drafts, *scope), n in zip(items, lengths):
            key = None if temperature == 0 else mx.random.key(seed if seed is not None else _fresh_seed())
            state = engine.seqs[seq_id] = SeqState(None, temperature, top_p, key, length=n, drafts=drafts,
                                                   scope=scope[0] if scope else None,
                                                   proc=engine.processor(seq_id, ids))
            self.states.append(state)


def advance(engine, group: PrefillGroup, budget: int | None) -> tuple[list[int] | None, int]:
    """Prefill up to `budget` padded tokens (rows x positions; None: the rest). Returns each
    sequence's first token once the group is done (else None), and the padded tokens run."""
    rows = len(group.states)
    positions = group.width if budget is None else max(1, budget // rows)
    spent = 0
    while group.width - group.done > 1 and spent < positions:
        n = min(engine.prefill_step, group.width - group.done - 1, positions - spent)
        _forward(engine, group, n)
        mx.eval([c.state for c in group.cache])
        group.done, spent = group.done + n, spent + n
    if group.width - group.done > 1:
        return None, spent * rows
    logits = _forward(engine, group, 1)[:, -1]
    lasts = [processed(state, logits[b:b + 1]) for b, state in enumerate(group.states)]
    firsts = [_first_token(state, row[0]) for row, state in zip(lasts, group.states)]
    mx.eval(firsts)
    for state, first, row in zip(group.states, firsts, lasts):
        state.last = first.reshape(1).astype(mx.uint32)
        commit(state, state.last)
        note(state, row, [int(first.item())])
    engine.batch.incoming.append((group.ids, group.cache))
    return [int(f.item()) for f in firsts], (spent + 1) * rows


def _forward(engine, group: PrefillGroup, n: int) -> mx.array:
    start = group.done
    layers = engine.drafter.feature_layers if engine.drafter is not None else ()
    final, hidden = body(engine.model, group.tokens[:, start:start + n], group.cache, layers)
    for b, (pad, state) in enumerate(zip(group.pads, group.states)):
        first = max(0, pad - start)  # the drafter sees each row's real tokens, not its padding
        if first < n and (drafter := engine.drafter_of(state)) is not None:
            drafter.fed(state, group.tokens[b, start + first:start + n], hidden[b, first:])
    return output_head(engine.model)(final)


def _first_token(state, logits: mx.array) -> mx.array:
    if state.temperature == 0:
        return mx.argmax(logits - mx.logsumexp(logits, keepdims=True), axis=-1)
    return sample(probs_from_logits(logits, state.temperature, state.top_p), state.next_key())
