"""One sequence's logit processing on the owner thread: the penalties it asked for, its grammar's
token mask (structured output), and the log-probabilities it owes its request.

Every path that turns target logits into a token (prefill, plain step, lookahead, verify, batch rows)
calls `processed` on them first, so the distribution speculation accepts against is the penalised
target's. A verify forward's rows sit at consecutive positions: row i sees the output as it would be
had drafts[:i] been accepted, so its counts are the committed ones plus those drafts, exactly what a
plain step at that position would have seen; likewise its mask is the grammar's after drafts[:i]
(the matcher walks the drafts and rolls back). A grammar needs each token's value before the next
mask, so its sequences take no lookahead step.
"""

from __future__ import annotations

from dataclasses import dataclass

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import numpy as np

from kernels.sampling import penalise, token_logprobs


@dataclass(frozen=True)
class ProcessSpec:
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    top_logprobs: int | None = None  # None: no log-probabilities; 0: the chosen token's only
    matcher: object = None  # an llguidance LLMatcher of the sequence's grammar (runtime/grammar.py), or None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias): added after the penalties

    @property
    def penalises(self) -> bool:
        return bool(self.presence or self.frequency or self.repetition != 1.0)

    @property
    def neutral(self) -> bool:
        return not self.penalises and self.top_logprobs is None and self.matcher is None and not self.logit_bias


class Processor:
    def __init__(self, spec: ProcessSpec, prompt_ids):
        self.spec = spec
        self.matcher = spec.matcher
        self.prompt_ids = list(prompt_ids)
        self.counts: mx.array | None = None  # [V] float32, occurrences in the output (built lazily: V)
        self.seen: mx.array | None = None  # [V] bool, prompt or output (repetition penalty only)
        self.logprobs: list[tuple] = []  # of emitted tokens not yet handed to the scheduler
        self.bias: mx.array | None = None  # [V] float32 of spec.logit_bias, built at the first rows()

    def rows(self, logits: mx.array, drafts=()) -> mx.array:
        """Penalised, biased and masked logits [R, V] for R consecutive positions, the ith after drafts[:i]."""
        logits = self._biased(self._penalised(logits, drafts))
        if self.matcher is None:
            return logits
        return mx.where(self._masks(list(drafts), logits.shape[0], logits.shape[-1]), logits, -mx.inf)

    def _masks(self, drafts: list[int], rows: int, vocab: int) -> mx.array:
        """The grammar's allowed tokens [R, V] at each row; rows past a forbidden draft are never
        reached by acceptance (that draft is rejected), so they stay unmasked."""
        m = self.matcher
        walked = m.validate_tokens(drafts[:rows - 1]) if rows > 1 else 0
        masks = np.ones((rows, vocab), dtype=bool)
        for i in range(walked + 1):
            masks[i] = _unpack(m.compute_bitmask(), vocab)
            if i < walked:
                m.consume_token(drafts[i])
        m.rollback(walked)
        return mx.array(masks)

    @property
    def blocks_lookahead(self) -> bool:
        return self.matcher is not None

    def _biased(self, logits: mx.array) -> mx.array:
        if not self.spec.logit_bias:
            return logits
        if self.bias is None:
            bias = np.zeros(logits.shape[-1], dtype=np.float32)
            for token, value in self.spec.logit_bias:
                bias[token] = value
            self.bias = mx.array(bias)
        return logits.astype(mx.float32) + self.bias

    def _penalised(self, logits: mx.array, drafts) -> mx.array:
        if not self.spec.penalises:
            return logits
        self._ensure(logits.shape[-1])
        rows = logits.shape[0]
        counts = position_counts(self.counts, mx.array(list(drafts)[:rows - 1], dtype=mx.int32)[None], rows)[0] \
            if len(drafts) and rows > 1 else self.counts[None]
        seen = None if self.seen is None else self.seen[None] | (counts > 0)
        s = self.spec
        return penalise(logits, counts, seen, s.presence, s.frequency, s.repetition)

    def commit(self, tokens: mx.array) -> None:
        """Tokens that became output (lazy ids are fine: a lookahead's token is counted unread)."""
        if self.matcher is not None:
            for token in tokens.reshape(-1).tolist():
                self.matcher.consume_token(token)  # False only for an ending token: the sequence stops
        if self.counts is not None:
            self.counts = self.counts + _one_hot(tokens, self.counts.shape[0]).sum(axis=0)
            if self.seen is not None:
                self.seen = self.seen | (self.counts > 0)

    def snapshot(self) -> tuple:
        return self.counts, self.seen

    def restore(self, snapshot: tuple) -> None:
        self.counts, self.seen = snapshot

    def note(self, logits: mx.array, token_ids: list[int]) -> None:
        """Record the log-probabilities of emitted tokens from the processed logits that chose them."""
        if self.spec.top_logprobs is not None and token_ids:
            self.logprobs += token_logprobs(logits[:len(token_ids)], list(token_ids), self.spec.top_logprobs)

    def take_logprobs(self) -> list[tuple]:
        out, self.logprobs = self.logprobs, []
        return out

    def _ensure(self, vocab: int) -> None:
        if self.counts is None:
            self.counts = mx.zeros((vocab,), dtype=mx.float32)
            if self.spec.repetition != 1.0:
                self.seen = mx.zeros((vocab,), dtype=mx.bool_)
                if self.prompt_ids:
                    self.seen = _one_hot(self.prompt_ids, vocab).sum(axis=0) > 0


def position_counts(counts: mx.array, drafts: mx.array, rows: int) -> mx.array:
    """The output's counts [B, rows, V] at each of `rows` consecutive positions, for drafts [B, K]:
    row i counts the committed output (counts [V]) plus drafts[:i]."""
    vocab = counts.shape[-1]
    earlier = (mx.arange(vocab) == drafts[..., None]).astype(mx.float32)[:, :rows - 1]
    zero = mx.zeros((drafts.shape[0], 1, vocab), dtype=mx.float32)
    return counts + mx.concatenate([zero, mx.cumsum(earlier, axis=1)], axis=1)


def _unpack(bitmask: bytes, vocab: int) -> np.ndarray:
    """llguidance's bitmask (bit i of 32-bit little-endian words: token i allowed) as bools [vocab]."""
    bits = np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little").astype(bool)
    allowed = np.zeros(vocab, dtype=bool)
    allowed[:min(vocab, bits.size)] = bits[:vocab]
    return allowed if allowed.any() else np.ones(vocab, dtype=bool)  # nothing allowed: leave it be


def _one_hot(ids, vocab: int) -> mx.array:
    ids = ids if isinstance(ids, mx.array) else mx.array(list(ids), dtype=mx.int32)
    return (mx.arange(vocab)[None] == ids.reshape(-1, 1).astype(mx.int32)).astype(mx.float32)


def make_processor(spec: ProcessSpec | None, prompt_ids) -> Processor | None:
    """None for a neutral spec: the paths then skip processing entirely (no cost by default)."""
    return None if spec is None or spec.neutral else Processor(spec, prompt_ids)


def processed(state, logits: mx.array, drafts=()) -> mx.array:
    """The logits a sequence samples or accepts from: its processor's rows, or the logits as they are."""
    return logits if state.proc is None else state.proc.rows(logits, drafts)


def note(state, logits: mx.array, token_ids) -> None:
    if state.proc is not None:
        state.proc.note(logits, list(token_ids))


def blocks_lookahead(state) -> bool:
    return state.proc is not None and state.proc.blocks_lookahead


def commit(state, tokens) -> None:
    if state.proc is not None and (state.proc.counts is not None or state.proc.matcher is not None):
        state.proc.commit(tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.int32))
