"""How many padded prompt tokens one mtp_batch step may prefill (chunked prefill), by measurement.

A chunk costs about STEPS_PER_CHUNK decode steps of the running batch: a long prompt arriving
delays the running requests' next token by that much, not by its whole prefill, while chunks stay
large enough to prefill efficiently (at one step per chunk, measured at 16-32 clients here, p99
inter-token latency fell 2-3x but aggregate tok/s fell 5-15%: the batch spent longer at partial
width). Pure policy: the scheduler passes measured times in.
"""

from __future__ import annotations

STEPS_PER_CHUNK = 4
FLOOR = 256  # padded tokens: smaller chunks pay a forward's fixed costs for little work
CEILING = 8192
UNMEASURED = 512  # until both a prefill chunk and a decode step have been timed
WEIGHT = 0.3  # EWMA weight of the newest measurement


class PrefillBudget:
    def __init__(self, steps_per_chunk: float = STEPS_PER_CHUNK, floor: int = FLOOR, ceiling: int = CEILING):
        self.steps_per_chunk, self.floor, self.ceiling = steps_per_chunk, floor, ceiling  # Config.scheduler
        self.prefill_tok_s: float | None = None  # padded tokens per second of prefill chunks
        self.step_s: float | None = None  # wall seconds of a decode step

    def note_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.prefill_tok_s = _ewma(self.prefill_tok_s, tokens / seconds)

    def note_step(self, seconds: float) -> None:
        if seconds > 0:
            self.step_s = _ewma(self.step_s, seconds)

    def tokens(self) -> int:
        if self.prefill_tok_s is None or self.step_s is None:
            return UNMEASURED
        return max(self.floor, min(self.ceiling, round(self.steps_per_chunk * self.step_s * self.prefill_tok_s)))

    def snapshot(self) -> dict:
        return {"tokens": self.tokens(), "prefill_tok_s": self.prefill_tok_s, "step_s": self.step_s}


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - WEIGHT) * old + WEIGHT * new
