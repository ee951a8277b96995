"""Graceful shutdown's bookkeeping: how many requests are open, and whether new ones are admitted.

Every request passes through runtime/gateway.open_request, which enters here first and leaves when
its events end. On SIGTERM the server closes the door (a new request gets a 503), waits up to
--shutdown-timeout for the open ones to end, then stops the system, which cancels the rest with
one terminal event each.
"""

from __future__ import annotations

import asyncio

from runtime.messages import ActorFailure

SHUTTING_DOWN = "server is shutting down: it admits no new requests; retry on another instance"


class Drain:
    def __init__(self):
        self.open = 0
        self.closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        if self.closed:
            raise ActorFailure("server", SHUTTING_DOWN, 503)
        self.open += 1
        self._idle.clear()

    def leave(self) -> None:
        self.open -= 1
        if self.open == 0:
            self._idle.set()

    async def close(self, timeout: float) -> bool:
        """Admit nothing more; True if every open request ended within timeout seconds."""
        self.closed = True
        if self.open == 0:  # wait_for with a timeout of 0 would time out even on an idle server
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
