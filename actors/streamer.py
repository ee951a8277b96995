"""Streamer: routes each request's events to the client connection that waits for them.

Receives Subscribe (the client's event queue for a request), Unsubscribe, TokensEmitted, the
terminal events, and FailOpen (a failure elsewhere: every open request fails). Releases each
request's admission slot once (Admission.release: never waits, so the streamer awaits no send to
an actor that sends to the scheduler) and sends Samples to telemetry. A request ends with exactly
one terminal event; a second one is dropped and logged. Sends telemetry the gap
between a request's emissions (inter-token latency) and one RequestEnded with its receipt.
"""

from __future__ import annotations

import asyncio
import time
from typing import assert_never

from runtime.actor import Actor
from runtime.messages import (
    Cancelled, Failed, FailOpen, Finished, Sample, Subscribe, TokensEmitted, Unsubscribe,
)
from runtime.observe import RequestEnded


class Streamer(Actor):
    name = "streamer"

    def __init__(self, admission: Actor | None, telemetry: Actor):
        super().__init__()  # its inbox bound: Config.actors
        self.admission, self.telemetry = admission, telemetry
        self.subscribers: dict[str, asyncio.Queue] = {}
        self.ended: set[str] = set()
        self.emitted_at: dict[str, float] = {}  # each open request's latest emission

    async def handle(self, msg) -> None:
        match msg:
            case Subscribe():
                self.subscribers[msg.request_id] = msg.queue
            case Unsubscribe():
                self.subscribers.pop(msg.request_id, None)
            case TokensEmitted():
                if (queue := self.subscribers.get(msg.request_id)) is not None:
                    queue.put_nowait(msg)
                if msg.request_id not in self.ended:
                    await self.note_emitted(msg.request_id)
            case Finished() | Cancelled() | Failed():
                await self.terminal(msg)
            case FailOpen():
                for request_id in list(self.subscribers):
                    await self.terminal(Failed(request_id=request_id, error=msg.error, status=msg.status))
            case _:
                assert_never(msg)

    async def terminal(self, msg: Finished | Cancelled | Failed) -> None:
        if msg.request_id in self.ended:
            self.log.warning("duplicate_terminal", request_id=msg.request_id, event_type=type(msg).__name__)
            return
        self.ended.add(msg.request_id)
        if len(self.ended) > 100_000:  # ids are only kept to catch duplicates; bound the memory
            self.ended.clear()
        if (queue := self.subscribers.pop(msg.request_id, None)) is not None:
            queue.put_nowait(msg)
        if self.admission is not None:
            self.admission.release(msg.request_id)
        outcome = type(msg).__name__.lower()
        await self.telemetry.tell(Sample(name="requests_total", value=1, labels=(("outcome", outcome),)))
        self.emitted_at.pop(msg.request_id, None)
        detail = msg.finish_reason if isinstance(msg, Finished) else msg.reason if isinstance(msg, Cancelled) \
            else msg.error
        await self.telemetry.tell(RequestEnded(request_id=msg.request_id, outcome=outcome, detail=detail,
                                               usage=getattr(msg, "usage", None), at=time.time()))

    async def note_emitted(self, request_id: str) -> None:
        now = time.monotonic()
        previous, self.emitted_at[request_id] = self.emitted_at.get(request_id), now
        if previous is not None:
            await self.telemetry.tell(Sample(name="inter_token_latency_seconds", value=now - previous,
                                             kind="observe"))
