"""Prefill several new sequences in one forward (mtp_batch): prompts left-padded into a fresh batch
cache, which joins the running batch at its next step. Mirrors mlx-lm's batched prefill."""

from __future__ import annotations

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from kernels.loader import output_head
from kernels.sampling import probs_from_logits, sample


def prefill_rows(engine, items: list[tuple[str, list[int], float, float, int | None, bool]]) -> list[int]:
    """items: (seq_id, prompt_ids, temperature, top_p, seed, drafts). Returns each sequence's first token."""
    from kernels.engine import SeqState, _fresh_seed

    lengths = [len(ids) for _, ids, *_ in items]
    width = max(lengths)
    pads = [width - n for n in lengths]
    tokens = mx.array([[0] * pad + list(ids) for pad, (_, ids, *_) in zip(pads, items)], dtype=mx.uint32)
    cache = [BatchKVCache(pads) for _ in engine.model.model.layers]
    states = []
    for (seq_id, ids, temperature, top_p, seed, drafts), n in zip(items, lengths):
        key = None if temperature == 0 else mx.random.key(seed if seed is not None else _fresh_seed())
        state = engine.seqs[seq_id] = SeqState(None, temperature, top_p, key, length=n, drafts=drafts)
        states.append(state)
    done = 0
    while width - done > 1:
        n = min(engine.prefill_step, width - done - 1)
        _forward(engine, tokens, done, n, pads, cache, states)
        mx.eval([c.state for c in cache])
        done += n
    logits = _forward(engine, tokens, done, 1, pads, cache, states)[:, -1]
    firsts = [_first_token(state, logits[b]) for b, state in enumerate(states)]
    mx.eval(firsts)
    for state, first in zip(states, firsts):
        state.last = first.reshape(1).astype(mx.uint32)
    engine.batch.incoming.append(([seq_id for seq_id, *_ in items], cache))
    return [int(f.item()) for f in firsts]


def _forward(engine, tokens, start: int, n: int, pads, cache, states) -> mx.array:
    hidden = engine.model.model(tokens[:, start:start + n], cache=cache)
    for b, (pad, state) in enumerate(zip(pads, states)):
        first = max(0, pad - start)  # the drafter sees each row's real tokens, not its padding
        if first < n and (drafter := engine.drafter_of(state)) is not None:
            drafter.fed(state, tokens[b, start + first:start + n], hidden[b, first:])
    return output_head(engine.model)(hidden)


def _first_token(state, logits: mx.array) -> mx.array:
    if state.temperature == 0:
        return mx.argmax(logits - mx.logsumexp(logits, keepdims=True), axis=-1)
    return sample(probs_from_logits(logits, state.temperature, state.top_p), state.next_key())
