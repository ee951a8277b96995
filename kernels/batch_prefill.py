"""Prefill several new sequences together (mtp_batch): prompts left-padded into a fresh batch cache,
which joins the running batch at its next step. Mirrors mlx-lm's batched prefill.

A group may prefill over several steps (chunked prefill): each call runs at most a budget of padded
tokens, so the running batch's next decode step waits for one chunk, not for the whole group.
Twins (a newcomer whose prompt, drafting and prompt-cache scope equal an earlier one's, e.g. the
choices of an n > 1 request) run no forward: when the group ends each takes owned copies of its
source row's KV and drafter state and draws its first token from the source's last logits.
"""

from __future__ import annotations

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from kernels.features import body
from kernels.loader import output_head
from kernels.processing import commit, note, processed
from kernels.prompt_store import copy_layers, restored_cache
from kernels.sampling import greedy_ids, probs_from_logits, sample


class PrefillGroup:
    """Sequences prefilling together: their left-padded prompts, batch cache and progress."""

    def __init__(self, engine, items: list[tuple[str, list[int], float, float, int | None, bool, str | None]]):
        items, self.twins = split_twins(items) if engine.can_twin else (items, [])  # (twin, source index)
        lengths = [len(ids) for _, ids, *_ in items]
        self.ids = [seq_id for seq_id, *_ in items]
        self.width, self.done = max(lengths), 0
        self.pads = [self.width - n for n in lengths]
        self.tokens = mx.array([[0] * pad + list(ids) for pad, (_, ids, *_) in zip(self.pads, items)],
                               dtype=mx.uint32)
        self.cache = [BatchKVCache(self.pads) for _ in engine.model.model.layers]
        self.states = [_new_state(engine, item) for item in items]
        self.twin_states = [_new_state(engine, item) for item, _ in self.twins]

    @property
    def all_ids(self) -> list[str]:
        """Every sequence the group prefills: its rows, then its twins (the order of advance's firsts)."""
        return self.ids + [item[0] for item, _ in self.twins]


def split_twins(items: list) -> tuple[list, list]:
    """(items to prefill, [(twin, index of its source among them)]): a twin shares prompt, drafting
    and a prompt-cache scope with an earlier item. A request that opts out of the cache shares nothing."""
    rows, twins, first = [], [], {}
    for item in items:
        key = (tuple(item[1]), item[5], item[6] if len(item) > 6 else None)
        if key[2] is not None and key in first:
            twins.append((item, first[key]))
        else:
            first.setdefault(key, len(rows))
            rows.append(item)
    return rows, twins


def _new_state(engine, item):
    from kernels.engine import SeqState, _fresh_seed

    seq_id, ids, temperature, top_p, seed, drafts, *scope = item
    key = None if temperature == 0 else mx.random.key(seed if seed is not None else _fresh_seed())
    state = engine.seqs[seq_id] = SeqState(None, temperature, top_p, key, length=len(ids), drafts=drafts,
                                           scope=scope[0] if scope else None, proc=engine.processor(seq_id, ids))
    return state


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
        engine.progress()
    if group.width - group.done > 1:
        return None, spent * rows
    logits = _forward(engine, group, 1)[:, -1]
    sources = list(range(rows)) + [b for _, b in group.twins]
    states = group.states + group.twin_states
    for state, b in zip(group.twin_states, (b for _, b in group.twins)):
        _copy_row(engine, group, b, state)
    lasts = [processed(state, logits[b:b + 1]) for b, state in zip(sources, states)]
    firsts = [_first_token(state, row[0]) for row, state in zip(lasts, states)]
    mx.eval(firsts)
    for state, first, row in zip(states, firsts, lasts):
        state.last = first.reshape(1).astype(mx.uint32)
        commit(state, state.last)
        note(state, row, [int(first.item())])
    engine.batch.incoming.append((group.ids, group.cache))  # twins join later with their own caches
    return [int(f.item()) for f in firsts], (spent + 1) * rows


def _copy_row(engine, group: PrefillGroup, b: int, twin) -> None:
    """The twin gets owned copies of row b's prompt KV and drafter state, as if it had prefilled."""
    pad, source = group.pads[b], group.states[b]
    pairs = [(c.keys, c.values) for c in group.cache]
    twin.cache = restored_cache(copy_layers(pairs, pad, group.width, row=b), group.width - pad)
    twin.cached = twin.length  # its prompt tokens came from the source's prefill, like a cache hit
    if (drafter := engine.drafter_of(twin)) is not None:
        drafter.clone(source, twin)


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
        return greedy_ids(logits)
    return sample(probs_from_logits(logits, state.temperature, state.top_p), state.next_key())
