"""Verifying a draft tree (kernels/tree.py) in one target forward, and rolling back to its best path.

Two layouts, both exact:
- "mask": one row [last, n_1..n_N] over the sequence's own cache, each node attending to the prefix
  and its ancestors only (a tree attention mask), at the position of its depth. mlx-lm's attention
  reads positions from `cache.offset` and the mask from `cache.make_mask`, so a thin wrapper around
  each layer's KVCache supplies both, and each attention's RoPE is wrapped once so it accepts one
  position per token (RoPE's batch offsets, the tokens moved onto the batch axis). After the walk,
  the entries of the kept path are moved next to the prefix and the rest trimmed.
- "rows": one row per branch over a copy of the prefix cache (w rows, plain causal attention); the
  winning row's new entries are appended to the sequence's cache. Greedy only (a measurement and
  cross-check of the mask layout; it copies the whole prefix per step).
The MTP drafter then sees the kept path's hidden rows, as after a chain verify of that path.
"""

from __future__ import annotations

from dataclasses import dataclass

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

from kernels.features import body
from kernels.loader import output_head
from kernels.sampling import probs_from_logits, sample
from kernels.tree import DraftTree, branch_accepted, from_branches, walk, winning_branch


@dataclass(frozen=True)
class TreeResult:
    accepted: int
    emitted: list[int]
    branch: int  # the branch whose path was kept
    branch_accepted: list[int]  # what each branch alone would have had accepted


class Positions:
    """One position per token, where a cache's offset would give consecutive ones."""

    def __init__(self, array: mx.array):
        self.array = array


class PositionedRope(nn.Module):
    """A model's RoPE that also takes Positions: tokens go to the batch axis, one offset each."""

    def __init__(self, rope):
        super().__init__()
        self.inner = rope

    def __call__(self, x: mx.array, offset=0):
        if not isinstance(offset, Positions):
            return self.inner(x, offset=offset)
        moved = x.transpose(2, 1, 0, 3)  # [1, H, T, D] -> [T, H, 1, D]
        return self.inner(moved, offset=offset.array).transpose(2, 1, 0, 3)


class TreeCache:
    """One layer's cache during a tree forward: the real cache's storage, tree positions and mask."""

    def __init__(self, cache: KVCache, positions: Positions, mask: mx.array):
        self.cache, self.offset, self.mask = cache, positions, mask

    def update_and_fetch(self, keys, values):
        return self.cache.update_and_fetch(keys, values)

    def make_mask(self, *args, **kwargs):
        return self.mask


def can_branch(model) -> str | None:
    """Why this model cannot verify trees, or None: every attention layer must have a RoPE module to
    wrap (mlx-lm's common shape), and a probe tree's spine must get the chain's logits (a model that
    reads positions or masks some other way, sliding windows say, would not)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers or not all(hasattr(getattr(layer, "self_attn", None), "rope") for layer in layers):
        return "the model's attention has no RoPE module to place tree nodes"
    _wrap_ropes(model)
    prefix, spine, leaf = [1, 2, 3, 4, 5, 6], [7, 8], 9
    chain_cache, tree_cache = make_prompt_cache(model), make_prompt_cache(model)
    for cache in (chain_cache, tree_cache):
        model(mx.array([prefix]), cache=cache)
    chain = model(mx.array([[10, *spine]]), cache=chain_cache)[0]
    tree = from_branches([spine, [leaf]])
    positions = Positions(mx.array([len(prefix) + d for d in tree.depths()]))
    caches = [TreeCache(c, positions, tree_mask(tree, len(prefix))) for c in tree_cache]
    branched = model(mx.array([[10, *tree.tokens]]), cache=caches)[0, :len(spine) + 1]
    scale = mx.max(mx.abs(chain)).item()
    if not mx.allclose(branched, chain, atol=1e-3 * max(scale, 1.0), rtol=1e-3).item():
        return "a probe tree's logits differ from the chain's (the model places or masks tokens its own way)"
    return None


def _wrap_ropes(model) -> None:
    for layer in model.model.layers:
        if not isinstance(layer.self_attn.rope, PositionedRope):
            layer.self_attn.rope = PositionedRope(layer.self_attn.rope)


def tree_mask(tree: DraftTree, offset: int) -> mx.array:
    """[T, offset + T] booleans: every node sees the prefix, itself and its ancestors."""
    size = tree.size + 1
    rows = [[False] * size for _ in range(size)]
    for node, seen in enumerate(tree.ancestors()):
        for a in seen:
            rows[node][a] = True
    own = mx.array(rows)
    return mx.concatenate([mx.ones((size, offset), dtype=mx.bool_), own], axis=1)


def verify_tree(engine, seq_id: str, tree: DraftTree) -> TreeResult:
    """The mask layout: one forward, the walk, the roll back to the kept path."""
    state = engine.seqs[seq_id]
    engine.settle(state)
    _wrap_ropes(engine.model)
    offset = state.length
    positions = Positions(mx.array([offset + d for d in tree.depths()]))
    mask = tree_mask(tree, offset)
    caches = [TreeCache(c, positions, mask) for c in state.cache]
    tokens = mx.concatenate([state.last.astype(mx.uint32).reshape(1), mx.array(tree.tokens, dtype=mx.uint32)])
    logits, hidden = _forward(engine, state, tokens[None], caches)
    next_tokens = _next_tokens(state, logits[0])
    path, emitted = walk(tree, next_tokens)
    _keep(state, [0] + path, offset, tree.size + 1)
    _commit(engine, state, hidden[0, mx.array([0] + path)] if hidden is not None else None, path, emitted)
    return TreeResult(len(path), emitted, winning_branch(tree, path), branch_accepted(tree, next_tokens))


def verify_rows(engine, seq_id: str, tree: DraftTree) -> TreeResult:
    """The rows layout (greedy): each branch a row over a copy of the prefix cache."""
    state = engine.seqs[seq_id]
    if state.temperature > 0:
        raise ValueError("the rows layout verifies greedy sequences only")
    engine.settle(state)
    offset, branches = state.length, [tree.branch(b) for b in range(tree.width)]
    longest = max(len(b) for b in branches)
    last = state.last.astype(mx.uint32).reshape(1)
    rows = mx.stack([mx.concatenate([last, mx.array(b + [0] * (longest - len(b)), dtype=mx.uint32)])
                     for b in branches])
    copies = [_row_copy(c, offset, len(branches)) for c in state.cache]
    logits, hidden = _forward(engine, state, rows, copies)
    argmax = mx.argmax(logits, axis=-1).tolist()
    accepted = [_row_accepted(branch, row) for branch, row in zip(branches, argmax)]
    best = max(range(len(branches)), key=lambda b: (accepted[b], -b))
    n = accepted[best]
    for c, copy in zip(state.cache, copies):
        c.update_and_fetch(copy.keys[best:best + 1, :, offset:offset + n + 1],
                           copy.values[best:best + 1, :, offset:offset + n + 1])
    state.length = offset + n + 1
    emitted = branches[best][:n] + [argmax[best][n]]
    path = tree.path(tree.leaves[best])[:n]
    _commit(engine, state, hidden[best, :n + 1] if hidden is not None else None, path, emitted)
    return TreeResult(n, emitted, best, accepted)


def _forward(engine, state, tokens: mx.array, caches) -> tuple[mx.array, mx.array | None]:
    drafter = engine.drafter_of(state)
    if drafter is None or not drafter.wants_hidden:
        return engine.model(tokens, cache=caches), None
    final, hidden = body(engine.model, tokens, caches, drafter.feature_layers)
    return output_head(engine.model)(final), hidden


def _next_tokens(state, logits: mx.array) -> list[int]:
    """Each node's next token: the target's argmax, or a draw with the node's own key."""
    if state.temperature == 0:
        return mx.argmax(logits, axis=-1).tolist()
    probs = probs_from_logits(logits, state.temperature, state.top_p)
    return sample(probs, state.next_key()).tolist()  # one independent draw per row


def _keep(state, nodes: list[int], offset: int, written: int) -> None:
    """Move the kept nodes' entries right after the prefix, drop the rest."""
    if nodes != list(range(len(nodes))):
        source = mx.array([offset + n for n in nodes])
        for c in state.cache:
            keys, values = c.keys[..., source, :], c.values[..., source, :]
            c.keys[..., offset:offset + len(nodes), :] = keys
            c.values[..., offset:offset + len(nodes), :] = values
    for c in state.cache:
        c.trim(written - len(nodes))
    state.length = offset + len(nodes)


def _commit(engine, state, hidden, path: list[int], emitted: list[int]) -> None:
    """The drafter sees the kept path as a verified chain; the last emitted token is the next input."""
    drafter = engine.drafter_of(state)
    if drafter is not None:
        drafter.verified(state, hidden)
        drafter.commit(state, len(path), len(path), emitted)
    state.last = mx.array(emitted[-1:], dtype=mx.uint32)
    state.draft_probs = None


def _row_copy(cache: KVCache, offset: int, rows: int) -> KVCache:
    copy = KVCache()
    keys, values = cache.keys[..., :offset, :], cache.values[..., :offset, :]
    copy.keys, copy.values = mx.repeat(keys, rows, axis=0), mx.repeat(values, rows, axis=0)
    copy.offset = offset
    return copy


def _row_accepted(branch: list[int], argmax_row: list[int]) -> int:
    n = 0
    while n < len(branch) and branch[n] == argmax_row[n]:
        n += 1
    return n
