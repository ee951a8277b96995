"""Speculative acceptance: exact greedy match, and rejection sampling that preserves the target.

`accept_rows` is the rule (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling"), batched over rows so a verifier at width B and the statistical tests call
the same code. `accept_drafts` and `accept_greedy` are the one-sequence entry points; they return
plain Python (ints and lists), never an `mx.array`.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from kernels.sampling import sample

# Below this mass the residual is float noise around zero: the true rejection chance is nil there,
# so falling back to p itself costs nothing measurable and avoids dividing by ~0.
_EMPTY_RESIDUAL = 1e-6


def accept_rows(
    target_probs: mx.array,
    draft_ids: mx.array,
    draft_probs: mx.array | None,
    key: mx.array | None = None,
) -> tuple[mx.array, mx.array]:
    """Rejection-sample B rows of K drafts against the target; lazy.

    target_probs [B, K+1, V]: p_0..p_K, the target's distributions at each draft position plus one
    for the bonus. draft_ids [B, K]: x_0..x_{K-1}, each drawn from q_i. draft_probs [B, K, V]: q_i,
    or None for a deterministic drafter (q_i is one-hot at x_i, e.g. n-gram lookup). Both p and q
    must already carry the same temperature and top-p (`sampling.probs_from_logits`).
    Returns (n_accepted [B], next_token [B]); each row emits x_0..x_{n-1} and then next_token.
    """
    batch, k = draft_ids.shape
    vocab = target_probs.shape[-1]
    _check_shapes(target_probs, draft_probs, batch, k)
    accept_key, sample_key = mx.random.split(key) if key is not None else (None, None)
    ids = draft_ids.astype(mx.int32)
    p = target_probs[:, :k, :]
    # A deterministic drafter puts all its mass on x_i: q_i(x_i) = 1, zero elsewhere.
    q = draft_probs if draft_probs is not None else (mx.arange(vocab) == ids[..., None]) * 1.0
    p_x = mx.take_along_axis(p, ids[..., None], axis=-1)[..., 0]
    q_x = mx.take_along_axis(q, ids[..., None], axis=-1)[..., 0]

    # Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)): u < p/q, written u*q < p so that
    # q(x) = 0 never divides (p/q is then infinite: always accept unless p(x) = 0 too).
    u = mx.random.uniform(shape=(batch, k), key=accept_key)
    accepted = (u * q_x) < p_x
    # Stop at the first rejection: n = length of the leading run of accepts.
    n_accepted = mx.sum(mx.cumprod(accepted.astype(mx.int32), axis=-1), axis=-1)

    # On a rejection at i, draw from normalize(max(0, p_i - q_i)): the mass p has beyond q.
    # Accept-or-residual at position i then yields exactly p_i. With one-hot q the residual is
    # p_i with x_i zeroed. If all K drafts pass, the bonus token is drawn from p_K itself.
    residual = mx.maximum(p - q, 0.0)
    mass = mx.sum(residual, axis=-1, keepdims=True)
    residual = mx.where(mass > _EMPTY_RESIDUAL, residual / mx.maximum(mass, 1e-30), p)
    fallback = mx.concatenate([residual, target_probs[:, k:, :]], axis=1)  # [B, K+1, V]
    chosen = mx.take_along_axis(fallback, n_accepted[:, None, None], axis=1)[:, 0, :]
    return n_accepted, sample(chosen, sample_key)


def _check_shapes(target_probs: mx.array, draft_probs: mx.array | None, batch: int, k: int):
    if target_probs.shape[:2] != (batch, k + 1):
        raise ValueError(f"target_probs {target_probs.shape} needs shape ({batch}, {k + 1}, V)")
    if draft_probs is not None and draft_probs.shape != (batch, k, target_probs.shape[-1]):
        raise ValueError(f"draft_probs {draft_probs.shape} needs shape ({batch}, {k}, V)")


def accept_drafts(
    target_probs: mx.array,
    draft_ids: Sequence[int] | mx.array,
    draft_probs: mx.array | None,
    key: mx.array | None = None,
) -> tuple[int, list[int]]:
    """Rejection sampling for one sequence: (n_accepted, emitted ids, length n_accepted + 1).

    target_probs [K+1, V], draft_ids [K], draft_probs [K, V] or None (deterministic drafter).
    """
    ids = draft_ids if isinstance(draft_ids, mx.array) else mx.array(list(draft_ids), mx.int32)
    ids = ids.reshape(1, -1)
    q = draft_probs[None] if draft_probs is not None else None
    n_accepted, next_token = accept_rows(target_probs[None], ids, q, key)
    mx.eval(n_accepted, next_token)
    n = int(n_accepted.item())
    return n, ids[0, :n].tolist() + [int(next_token.item())]


def accept_greedy(
    target_ids: Sequence[int] | mx.array, draft_ids: Sequence[int] | mx.array
) -> tuple[int, list[int]]:
    """Exact-match acceptance at temperature 0: (n_accepted, emitted ids).

    target_ids [K+1] are the target's argmax tokens at each draft position plus the bonus one.
    Drafts are accepted while they equal the target's token; the target's token at the first
    mismatch (or the bonus token after K matches) is emitted after them.
    """
    target = _as_list(target_ids)
    drafts = _as_list(draft_ids)
    if len(target) != len(drafts) + 1:
        raise ValueError(f"need K+1 target ids for K drafts, got {len(target)} and {len(drafts)}")
    n = 0
    while n < len(drafts) and drafts[n] == target[n]:
        n += 1
    # The accepted drafts equal the target's own tokens, so the emitted run is target[:n+1].
    return n, target[: n + 1]


def _as_list(ids: Sequence[int] | mx.array) -> list[int]:
    return ids.tolist() if isinstance(ids, mx.array) else [int(i) for i in ids]
