"""Paced streaming: speculation emits tokens in bursts (a verify step's accepted drafts at once);
pacing spreads them over the measured inter-token interval so a reader sees an even cadence.

The policy (Pacer) is pure. It measures two EWMAs over bursts: the gap between bursts and the tokens
per burst; their ratio is the interval at which tokens really come. Tokens go out one interval apart
(a token bucket at the measured rate), each as soon as it arrives if the bucket is idle, and none is
held longer than one measured gap after it arrived (or than the token before it, to keep order).
The terminal event releases whatever is still held at once, before it: the last token of a response
is never delayed, and pacing adds nothing to its total time. `paced` applies it to a request's event stream, splitting each burst's text evenly
into one piece per token (its log-probabilities go with their token).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import msgspec

from runtime.messages import TokensEmitted

EWMA_WEIGHT = 0.3  # as the gate's throughput windows


class Pacer:
    def __init__(self, weight: float = EWMA_WEIGHT):
        self.weight = weight
        self.gap: float | None = None  # seconds between bursts, measured
        self.per_burst: float | None = None  # tokens per burst, measured
        self.arrived: float | None = None  # the latest burst's arrival
        self.free_at = 0.0  # when the bucket may release its next token
        self.planned = 0.0  # the latest release planned

    @property
    def interval(self) -> float:
        return self.gap / self.per_burst if self.gap is not None and self.per_burst else 0.0

    def plan(self, now: float, tokens: int) -> list[float]:
        """Release times of a burst of `tokens` arriving at `now`: one measured interval apart after
        those still held, none before it arrived nor later than one measured gap after (or than
        the token before it)."""
        if self.arrived is not None:
            self.gap = self._mix(self.gap, max(0.0, now - self.arrived))
        self.arrived, self.per_burst = now, self._mix(self.per_burst, float(tokens))
        latest = now + (self.gap or 0.0)
        times = []
        for _ in range(tokens):
            # In order: never before a token planned earlier, even where the gap has since shrunk.
            at = max(min(max(now, self.free_at), latest), self.planned)
            times.append(at)
            self.free_at, self.planned = at + self.interval, at
        return times

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.weight) * old + self.weight * new


def split(event: TokensEmitted) -> list[TokensEmitted]:
    """One event per token: the text cut evenly by characters, each token's log-probabilities with it."""
    n = len(event.token_ids)
    if n <= 1:
        return [event]
    cuts = [round(len(event.text) * i / n) for i in range(n + 1)]
    return [msgspec.structs.replace(event, token_ids=(token,), text=event.text[cuts[i]:cuts[i + 1]],
                                    index=event.index + i, logprobs=event.logprobs[i:i + 1])
            for i, token in enumerate(event.token_ids)]


async def paced(events, pacer: Pacer | None = None, clock=time.monotonic):
    """The events of one request, its bursts spread by the pacer."""
    pacer = pacer or Pacer()
    source = events.__aiter__()
    held: deque[tuple[float, TokensEmitted]] = deque()
    upcoming = asyncio.ensure_future(anext(source))
    try:
        while True:
            wait = max(0.0, held[0][0] - clock()) if held else None
            done, _ = await asyncio.wait({upcoming}, timeout=wait)
            while held and (held[0][0] <= clock() or (done and not _tokens(upcoming))):
                yield held.popleft()[1]  # due, or the request ended: everything held goes now
            if not done:
                continue
            try:
                event = upcoming.result()
            except StopAsyncIteration:
                return
            if _tokens(upcoming):
                held.extend(zip(pacer.plan(clock(), len(event.token_ids)), split(event)))
            else:
                yield event
            upcoming = asyncio.ensure_future(anext(source))
    finally:
        upcoming.cancel()


def _tokens(task) -> bool:
    """Whether a finished fetch brought tokens (not a terminal event, nor the end)."""
    if task.exception() is not None:
        return False
    return isinstance(task.result(), TokensEmitted) and bool(task.result().token_ids)
