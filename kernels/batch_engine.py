"""Batched steps for mtp_batch: plain rows and speculative rows of many sequences in one forward."""

from __future__ import annotations

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx

from kernels.acceptance import accept_drafts, accept_greedy
from kernels.batch_forward import forward_rows
from kernels.sampling import probs_from_logits, sample


def step_rows(engine, rows: list[tuple[str, list[int], bool]]) -> list[tuple[int, list[int]]]:
    """rows: (seq_id, drafts, use_draft_probs); no drafts = a plain row. Returns (accepted, emitted)
    per row. Plain rows are done; rows with drafts still need engine.rollback with their result."""
    states = [engine.seqs[seq_id] for seq_id, _, _ in rows]
    inputs = []
    for state, (_, drafts, _) in zip(states, rows):
        engine.settle(state)
        tokens = state.last.astype(mx.uint32).reshape(-1)
        if drafts:
            tokens = mx.concatenate([tokens, mx.array(drafts, dtype=mx.uint32)])
        inputs.append((tokens, state.cache))
    logits, hidden = forward_rows(engine.model, inputs)
    greedy_ids = {}
    for i, (state, (tokens, _), (_, drafts, _)) in enumerate(zip(states, inputs, rows)):
        state.length += tokens.shape[0]
        if engine.drafter is not None:
            engine.drafter.verified(state, hidden[i]) if drafts else engine.drafter.fed(state, tokens, hidden[i])
        if state.temperature == 0:
            row = logits[i]
            greedy_ids[i] = mx.argmax(row - mx.logsumexp(row, axis=-1, keepdims=True), axis=-1)
    mx.eval(list(greedy_ids.values()))  # one sync for every greedy row
    return [_accept(state, logits[i], greedy_ids.get(i), drafts, use_q)
            for i, (state, (_, drafts, use_q)) in enumerate(zip(states, rows))]


def _accept(state, logits: mx.array, greedy_ids, drafts: list[int], use_q: bool) -> tuple[int, list[int]]:
    if greedy_ids is not None:
        accepted, emitted = accept_greedy(greedy_ids.tolist(), drafts)
    elif drafts:
        p = probs_from_logits(logits, state.temperature, state.top_p)
        accepted, emitted = accept_drafts(p, drafts, state.draft_probs if use_q else None, state.next_key())
    else:
        token = sample(probs_from_logits(logits[-1], state.temperature, state.top_p), state.next_key())
        accepted, emitted = 0, [int(token.item())]
    if not drafts:
        state.last = mx.array(emitted, dtype=mx.uint32)
    return accepted, emitted
