"""The actor base: a bounded inbox, setup / run / teardown, tell and ask.

A failed ask goes back to the sender as an ActorFailure; at teardown every pending ask gets one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from runtime.messages import ActorFailure

_STOP = object()


class Rejected(Exception):
    """A handler's clean refusal, returned to the asker with a client-facing status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


class Actor:
    name = "actor"

    def __init__(self, inbox_size: int = 256):
        self.inbox: asyncio.Queue = asyncio.Queue(maxsize=inbox_size)
        self.log = structlog.get_logger().bind(actor=self.name)
        self._task: asyncio.Task | None = None
        self._sending: set[asyncio.Task] = set()  # tell_nowait's sends that found the inbox full
        self._closing = False
        self.stopped_reason: str | None = None  # why it stopped, for the askers it then fails
        self.ready = asyncio.Event()

    # --- what peers call -----------------------------------------------------------------
    async def tell(self, msg: Any) -> None:
        await self.inbox.put((msg, None))

    def tell_nowait(self, msg: Any) -> None:
        """Send without waiting (from a finally block or a cancelled handler): at once where the
        inbox has room, else from a task of its own, so a full inbox neither raises nor loses it."""
        try:
            self.inbox.put_nowait((msg, None))
        except asyncio.QueueFull:
            task = asyncio.get_running_loop().create_task(self.inbox.put((msg, None)))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def ask(self, msg: Any) -> Any:
        if self._closing:
            raise ActorFailure(self.name, self.stopped_reason or "actor is stopped", 503)
        reply = asyncio.get_running_loop().create_future()
        await self.inbox.put((msg, reply))
        return await reply

    def size_inbox(self, size: int) -> None:
        """Bound the inbox (Config.actors), before the actor starts: nothing is queued yet."""
        if self._task is not None:
            raise RuntimeError(f"{self.name}: an inbox is sized before the actor starts")
        self.inbox = asyncio.Queue(maxsize=size)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> asyncio.Task:
        self._task = asyncio.create_task(self._main(), name=self.name)
        return self._task

    async def started(self) -> None:
        """Wait until setup is done; re-raises a failed setup."""
        ready = asyncio.ensure_future(self.ready.wait())
        await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not self.ready.is_set():
            ready.cancel()
            self._task.result()  # raises the setup error
            raise RuntimeError(f"{self.name} stopped during setup")

    @property
    def closing(self) -> bool:
        return self._closing

    async def close(self, timeout: float = 30.0) -> None:
        """Stop after the messages already queued; safe to call twice. An actor still running after
        `timeout` (waiting on a peer that died, say) is cancelled: shutdown never hangs."""
        if self._task is None or self._task.done():
            return
        self._closing = True
        try:
            await asyncio.wait_for(self._stop_and_wait(), timeout)
        except asyncio.TimeoutError:
            self.log.error("actor_stop_timed_out", seconds=timeout)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _stop_and_wait(self) -> None:
        await self.inbox.put((_STOP, None))
        await asyncio.shield(self._task)

    async def setup(self) -> None:
        pass

    async def teardown(self) -> None:
        pass

    async def handle(self, msg: Any) -> Any:
        raise NotImplementedError

    async def run(self) -> None:
        """Default loop: one message at a time. Actors with their own rhythm override it."""
        while True:
            item = await self.inbox.get()
            if item[0] is _STOP:
                return
            await self.dispatch(*item)

    async def dispatch(self, msg: Any, reply: asyncio.Future | None) -> None:
        try:
            result = await self.handle(msg)
        except asyncio.CancelledError:
            self._reply_error(reply, ActorFailure(self.name, "actor stopped mid-request", 503))
            raise
        except Rejected as e:
            self._reply_error(reply, e)
        except Exception as e:
            self._reply_error(reply, ActorFailure(self.name, f"{type(e).__name__}: {e}"))  # the asker first
            self.log.exception("handler_failed", message=type(msg).__name__)
        else:
            if reply is not None and not reply.done():
                reply.set_result(result)

    def _reply_error(self, reply, error: Exception) -> None:
        if reply is not None and not reply.done():
            reply.set_exception(error)

    def is_stop(self, item) -> bool:
        return item[0] is _STOP

    async def _main(self) -> None:
        await self.setup()
        self.ready.set()
        try:
            await self.run()
        finally:
            self._closing = True
            self._fail_pending()
            await self.teardown()

    def _fail_pending(self) -> None:
        while not self.inbox.empty():
            _, reply = self.inbox.get_nowait()
            self._reply_error(reply, ActorFailure(self.name, self.stopped_reason or "actor stopped", 503))
