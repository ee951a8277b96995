"""The prompt cache's MLX side: copies of a finished sequence's KV and drafter state, kept under the
policy of runtime/prompt_cache.py, and restored into a new sequence whose prompt shares a prefix.

An entry owns its arrays: they are copied out of the live cache when it is stored, and a restored
cache starts from slices of them sized exactly to the reused length, so its first write concatenates
into a new buffer (mlx-lm's KVCache.update_and_fetch) and a later in-place write cannot reach the
entry either (MLX never writes in place into a buffer another array still holds). A live sequence
therefore never shares writable state with an entry or with another sequence.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import KVCache

from runtime.prompt_cache import PromptCacheIndex

Layers = tuple[tuple[mx.array, mx.array], ...]  # per layer (keys, values), each [1, heads, n, dim]


class Stored(NamedTuple):
    kv: Layers
    drafter: object | None  # the drafter's snapshot (kernels/drafters.py), None for one that never drafts


def copy_layers(pairs, start: int, end: int, row: int = 0) -> Layers:
    """Owned copies of positions [start, end) of one row of each layer's (keys, values)."""
    out = tuple((mx.contiguous(k[row:row + 1, :, start:end, :]), mx.contiguous(v[row:row + 1, :, start:end, :]))
                for k, v in pairs)
    mx.eval(out)
    return out


def restored_cache(layers: Layers, m: int) -> list[KVCache]:
    """Fresh KVCaches holding the first m positions of stored layers (no buffer shared for writing)."""
    caches = []
    for k, v in layers:
        cache = KVCache()
        cache.keys, cache.values, cache.offset = k[..., :m, :], v[..., :m, :], m
        caches.append(cache)
    return caches


def layers_nbytes(layers: Layers) -> int:
    return sum(k.nbytes + v.nbytes for k, v in layers)


def supports(cache: list) -> bool:
    """Only plain KV caches can be copied and cut back (rotating or quantized ones are not handled)."""
    return all(type(c) is KVCache for c in cache)


class PromptStore:
    def __init__(self, max_entries: int, max_bytes: int, kv_share: Fraction = Fraction(1)):
        self.index = PromptCacheIndex(max_entries, max_bytes)
        # A rank of a distributed group holds this share of the model's KV; entries are counted in
        # whole-model bytes, so every rank evicts (and reuses) the same entries as rank 0.
        self.kv_share = kv_share

    def peek(self, scope: str, prompt) -> int:
        return self.index.peek(scope, tuple(prompt))

    def restore(self, scope: str, prompt, state, drafter) -> int:
        """Give state the KV (and drafter state) of the longest cached prefix; the tokens reused."""
        entry, m = self.index.lookup(scope, tuple(prompt))
        if entry is None:
            return 0
        stored: Stored = entry.payload
        state.cache, state.length = restored_cache(stored.kv, m), m
        if drafter is not None:
            drafter.restore(state, stored.drafter, entry.tokens, m)
        return m

    def save(self, scope: str, tokens: tuple[int, ...], kv_source, drafter_snapshot, drafts: bool) -> None:
        """kv_source() -> the owned layers of these tokens; called only when the run is worth keeping.
        drafter_snapshot() -> the drafter's, or None."""
        if len(tokens) < 2 or not self.index.enabled or self.index.covers(scope, tokens):
            return
        snap = drafter_snapshot()
        if snap is None and drafts:
            return  # the drafter is mid-step: its state is not that of these tokens
        kv = kv_source()
        nbytes = int(layers_nbytes(kv) / self.kv_share) + (snap.nbytes if snap is not None else 0)
        self.index.insert(scope, tokens, nbytes, Stored(kv, snap))

    def snapshot(self) -> dict:
        return self.index.snapshot()


# --- the engine's two calls: a prefill reuses, a release keeps ------------------------------------

def reuse(engine, state, prompt_ids) -> int:
    """At prefill: restore the longest cached prefix of the prompt into state; the tokens reused."""
    store = engine.prompt_cache
    if store is None or state.scope is None:
        return 0
    state.cached = store.restore(state.scope, prompt_ids, state, engine.drafter_of(state))
    return state.cached


def keep(engine, seq_id: str, state, tokens: tuple[int, ...]) -> None:
    """At release: store the sequence's KV of `tokens` (its prompt and output, a prefix of what its
    cache holds) and its drafter state. A sequence still prefilling, or not yet joined to the batch
    (mtp_batch), is not kept."""
    store = engine.prompt_cache
    if store is None or state.scope is None or not tokens:
        return
    if state.cache is not None:
        engine.settle(state)  # a lookahead step in flight is not part of the committed run
        pairs, row, end = [(c.keys, c.values) for c in state.cache], 0, state.length
    elif engine.batch is not None and engine.batch.cache is not None and seq_id in engine.batch.ids:
        cache = engine.batch.cache
        row, end = engine.batch.ids.index(seq_id), cache[0]._idx - state.pending_trim
        if end - state.length < cache[0].left_padding[row].item():
            return  # the row's entries are not where its length says: keep nothing rather than garbage
        pairs = [(c.keys, c.values) for c in cache]
    else:
        return
    n = min(state.length, len(tokens))
    start = end - state.length
    drafter = engine.drafter_of(state)
    store.save(state.scope, tuple(tokens[:n]), lambda: copy_layers(pairs, start, start + n, row),
               (lambda: drafter.snapshot(state, n)) if drafter is not None else (lambda: None), drafter is not None)
