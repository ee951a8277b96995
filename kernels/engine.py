"""Forward passes for the model owner: prefill, plain decode with one step of lookahead, release.

Mirrors mlx-lm's generate loop (prompt[:-1] prefilled in chunks, then a step on the last token,
greedy = argmax of log-probabilities) so greedy output is byte-identical to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from kernels.sampling import probs_from_logits, sample


@dataclass
class SeqState:
    cache: list
    temperature: float
    top_p: float
    key: mx.array | None
    last: mx.array | None = None  # the last emitted token, input of the next step
    pending: mx.array | None = None  # the next token, already computing (lookahead)
    length: int = 0  # tokens in the KV cache
    extra: dict = field(default_factory=dict)


class Engine:
    def __init__(self, model, prefill_step: int = 2048):
        self.model = model
        self.prefill_step = prefill_step
        self.seqs: dict[str, SeqState] = {}

    def prefill(self, seq_id: str, prompt_ids, temperature: float, top_p: float,
                seed: int | None, lookahead: bool) -> int:
        key = None if temperature == 0 else mx.random.key(seed if seed is not None else _fresh_seed())
        state = SeqState(make_prompt_cache(self.model), temperature, top_p, key)
        self.seqs[seq_id] = state
        prompt = mx.array(prompt_ids, dtype=mx.uint32)
        done = 0
        while len(prompt_ids) - done > 1:
            n = min(self.prefill_step, len(prompt_ids) - done - 1)
            self.model(prompt[done:done + n][None], cache=state.cache)
            mx.eval([c.state for c in state.cache])
            done += n
        state.length = done
        y = self._step(state, prompt[done:])
        return self._emit(state, y, lookahead)

    def decode(self, seq_ids, lookahead) -> list[int]:
        out = []
        for seq_id, ahead in zip(seq_ids, lookahead):
            state = self.seqs[seq_id]
            y, state.pending = state.pending, None
            if y is None:
                y = self._step(state, state.last)
            out.append(self._emit(state, y, ahead))
        return out

    def release(self, seq_id: str) -> None:
        self.seqs.pop(seq_id, None)

    def _emit(self, state: SeqState, y: mx.array, lookahead: bool) -> int:
        # Build and start the next step before reading this token, so the graph build overlaps compute.
        state.last = y
        if lookahead:
            state.pending = self._step(state, y)
            mx.async_eval(state.pending)
        return y.item()

    def _step(self, state: SeqState, tokens: mx.array) -> mx.array:
        logits = self.model(tokens[None], cache=state.cache)[:, -1, :]
        state.length += tokens.shape[0]
        if state.temperature == 0:
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return mx.argmax(logprobs, axis=-1)
        state.key, sub = mx.random.split(state.key)
        return sample(probs_from_logits(logits[0], state.temperature, state.top_p), sub).reshape(1)

    def snapshot_lengths(self) -> dict[str, int]:
        return {k: v.length for k, v in self.seqs.items()}


def _fresh_seed() -> int:
    import secrets

    return secrets.randbits(63)
