"""The client side of the actor system: submit one request and iterate its events.

Whatever way the caller leaves (done, error, client gone), a request that has not ended is
cancelled, so its slot is freed and it still gets its one terminal event. A request that has no
first event within the queue wait is cancelled as `queue_timeout`; one whose events can no longer
come (the system failed and its streamer is gone) ends with a Failed made here, so no caller hangs.
A client that takes none of its events for --slow-client-timeout (RequestStream.deliver) is too
slow: its request is cancelled as `slow_client`, and the caller closes its connection. While the
server drains (SIGTERM), a new request is refused with a 503 (runtime/drain.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator

import msgspec
import structlog

from runtime.messages import (
    ActorFailure, Cancel, Cancelled, Failed, Finished, StreamEvent, Submit, Subscribe, Unsubscribe,
)

TERMINAL = (Finished, Cancelled, Failed)
QUEUE_TIMEOUT = "queue_timeout"  # the Cancel reason of a request that waited too long
SLOW_CLIENT = "slow_client"  # ... of one whose client stopped reading
_log = structlog.get_logger(actor="gateway")  # lazy: each call reads the configuration (a test capture too)
POLL_S = 1.0  # how often a waiting caller looks whether the system failed


class SlowClient(Exception):
    """The client stopped reading: the caller closes its connection (its request is cancelled)."""


def failure(system) -> str | None:
    """Why the system failed, or None (in-process test systems may not supervise)."""
    return getattr(system, "failure", None)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class RequestStream:
    def __init__(self, queue: asyncio.Queue, system, request_id: str, first_deadline: float | None):
        self.queue, self.system, self.request_id = queue, system, request_id
        self.first_deadline = first_deadline  # monotonic time by which the first event must come
        self.ended = False
        self.leave_reason = "client_gone"  # the Cancel reason if the caller leaves before the end
        self.prompt_tokens = 0  # set once admitted

    async def deliver(self, sending, timeout: float) -> None:
        """Await one write to the client; one that cannot complete in timeout seconds (the client
        stopped reading and the socket's buffers are full) raises SlowClient."""
        try:
            await asyncio.wait_for(sending, timeout)
        except asyncio.TimeoutError:
            self.leave_reason = SLOW_CLIENT
            _log.warning("slow_client", request_id=self.request_id, timeout_s=timeout, ended=self.ended)
            raise SlowClient(f"the client took no output for {timeout:g} s") from None

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def _events(self):
        while not self.ended:
            event = await self._next()
            self.first_deadline = None
            self.ended = isinstance(event, TERMINAL)
            yield await self._why(event) if isinstance(event, Cancelled) and event.reason == "shutdown" else event

    async def _why(self, event: Cancelled) -> StreamEvent:
        """An actor that crashes stops like one shut down: if the system failed, say that instead."""
        await asyncio.sleep(0)  # the supervisor's done-callback, scheduled with the crash, runs first
        if failure(self.system):
            return Failed(request_id=event.request_id, error=failure(self.system), status=503)
        return event

    async def _next(self) -> StreamEvent:
        while True:
            if not self.queue.empty():
                return self.queue.get_nowait()
            try:
                return await asyncio.wait_for(self.queue.get(), self._wait())
            except asyncio.TimeoutError:
                pass
            if self.first_deadline is not None and time.monotonic() >= self.first_deadline:
                self.first_deadline = None  # the Cancelled it causes is the terminal event
                self.system.scheduler.tell_nowait(Cancel(request_id=self.request_id, reason=QUEUE_TIMEOUT))
            elif failure(self.system) and self.system.streamer.closing:
                return Failed(request_id=self.request_id, error=failure(self.system), status=503)

    def _wait(self) -> float:
        if self.first_deadline is None:
            return POLL_S
        return max(0.0, min(POLL_S, self.first_deadline - time.monotonic()))


@asynccontextmanager
async def open_request(system, submit: Submit, max_wait_s: float | None = None) -> AsyncIterator[RequestStream]:
    """Subscribe, then admit (admission's Rejected propagates), then hand out the event stream;
    max_wait_s bounds the wait for the first event (None: unbounded).

    Subscribe is told, not asked: the streamer takes its inbox in order and every event of the
    request is sent after admission, so the queue is in place before the first one arrives.
    """
    if failure(system):  # a failed actor may never answer: refuse instead of waiting on it
        raise ActorFailure("system", f"server is degraded: {failure(system)}", 503)
    drain = getattr(system, "drain", None)  # in-process test systems may have none
    if drain is not None:
        drain.enter()  # raises a 503 while the server shuts down
    try:
        async with _open(system, submit, max_wait_s) as stream:
            yield stream
    finally:
        if drain is not None:
            drain.leave()


@asynccontextmanager
async def _open(system, submit: Submit, max_wait_s: float | None) -> AsyncIterator[RequestStream]:
    submit = submit if submit.submitted_at else _stamped(submit)
    # Unbounded on purpose, yet bounded by construction: the scheduler emits at most one event per
    # token and one terminal, so at most max_tokens + 1 (max_tokens_limit caps it) ever wait here.
    queue: asyncio.Queue = asyncio.Queue()
    await system.streamer.tell(Subscribe(request_id=submit.request_id, queue=queue))
    deadline = None if max_wait_s is None else submit.submitted_at + max_wait_s
    stream = RequestStream(queue, system, submit.request_id, deadline)
    admitted = False
    try:
        reply = await system.admission.ask(submit)
        stream.prompt_tokens = len(getattr(reply, "prompt_ids", ()))
        admitted = True
        yield stream
    finally:
        if admitted and not stream.ended:
            system.scheduler.tell_nowait(Cancel(request_id=submit.request_id, reason=stream.leave_reason))
        if not stream.ended:
            system.streamer.tell_nowait(Unsubscribe(request_id=submit.request_id))


def _stamped(submit: Submit) -> Submit:
    return msgspec.structs.replace(submit, submitted_at=time.monotonic())
