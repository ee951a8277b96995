"""The client side of the actor system: submit one request and iterate its events.

Whatever way the caller leaves (done, error, client gone), a request that has not ended is
cancelled, so its slot is freed and it still gets its one terminal event.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator

import msgspec

from runtime.messages import (
    Cancel, Cancelled, Failed, Finished, StreamEvent, Submit, Subscribe, Unsubscribe,
)

TERMINAL = (Finished, Cancelled, Failed)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class RequestStream:
    def __init__(self, queue):
        self.queue = queue
        self.ended = False

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def _events(self):
        while not self.ended:
            event = await self.queue.get()
            self.ended = isinstance(event, TERMINAL)
            yield event


@asynccontextmanager
async def open_request(system, submit: Submit) -> AsyncIterator[RequestStream]:
    """Subscribe, then admit (admission's Rejected propagates), then hand out the event stream.

    Subscribe is told, not asked: the streamer takes its inbox in order and every event of the
    request is sent after admission, so the queue is in place before the first one arrives.
    """
    submit = submit if submit.submitted_at else _stamped(submit)
    queue: asyncio.Queue = asyncio.Queue()  # unbounded on purpose: at most max_tokens events
    await system.streamer.tell(Subscribe(request_id=submit.request_id, queue=queue))
    stream = RequestStream(queue)
    admitted = False
    try:
        await system.admission.ask(submit)
        admitted = True
        yield stream
    finally:
        if admitted and not stream.ended:
            system.scheduler.tell_nowait(Cancel(request_id=submit.request_id, reason="client_gone"))
        if not stream.ended:
            system.streamer.tell_nowait(Unsubscribe(request_id=submit.request_id))


def _stamped(submit: Submit) -> Submit:
    return msgspec.structs.replace(submit, submitted_at=time.monotonic())
