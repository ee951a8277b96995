"""Rank 0's model owner in a distributed group (Config.distributed): it broadcasts every command to
the other ranks (kernels/group.py) just before running it on its thread, and they run the same
command on their part of the model (actors/follower.py). Only rank 0 samples, decides and replies;
the other ranks compute the same results from the same inputs, and rank 0 fills in what would
differ (a fresh seed) before it broadcasts.

Receives and replies what ModelOwner does; sends nothing more. Faults: a collective that fails (a
rank died), a command with no progress for `timeout_s` (a rank hangs; a long prefill progresses
chunk by chunk), or a rank whose result of a command differs from rank 0's (a divergence) loses
the group: the asker gets the error, the actor stops, and the system fails every in-flight request
and reports it on /health. While idle, a heartbeat every `heartbeat_s` finds a lost rank with no
request in flight. At shutdown the other ranks are told to stop; so are they when mlx.launch dies
(it leaves its ranks running): rank 0 then shuts down as on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from typing import Any

import msgspec

from actors.follower import silence
from actors.model_owner import ModelOwner
from runtime.config import DistributedConfig
from runtime.messages import Describe
from runtime.owner_messages import Heartbeat, OwnerCommand, Prefill, PrefillChunk, StopFollowers


class GroupOwner(ModelOwner):
    def __init__(self, *args, group: DistributedConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = group
        self.parallel = group.parallel
        self.lost: str | None = None  # why the group was lost, once it is
        self.digest = 0  # this rank's digest of its last command's result
        self.previous = "start-up"  # that command's name, for the divergence error
        self._lost: asyncio.Future | None = None
        self._running: tuple[str, float] | None = None  # (command, its start or last progress) on the thread
        self._queued = 0  # commands submitted and not finished
        self._idle_since = time.monotonic()
        self._beat: asyncio.Task | None = None

    async def setup(self) -> None:
        self._lost = asyncio.get_running_loop().create_future()
        await super().setup()
        self._beat = asyncio.create_task(self._heartbeat(), name="group_heartbeat")

    def _load(self):
        from kernels.group import Channel, init_group

        self.channel = Channel(init_group())
        info = super()._load()
        self.engine.progress = self._progressed
        return info

    def _progressed(self) -> None:
        """On the thread, after each prefill chunk: a long prompt's command is alive while it advances."""
        if (running := self._running) is not None:
            self._running = (running[0], time.monotonic())

    # --- rank 0's side of each command ---------------------------------------------------------
    def execute(self, msg: OwnerCommand | Heartbeat | StopFollowers) -> Any:
        from kernels.group import GroupLost, digest, error_digest

        msg = with_seeds(msg)
        digests = self.channel.send(msg, self.digest)
        if bad := [rank for rank, d in enumerate(digests) if d != self.digest]:
            raise GroupLost(f"distributed group lost: rank {bad[0]}'s result of {self.previous} differs from "
                            f"rank 0's (the ranks must run the same model, software and settings)")
        if isinstance(msg, (Heartbeat, StopFollowers)):
            return None
        self.previous = type(msg).__name__
        try:
            reply = super().execute(msg)
        except Exception as e:
            self.digest = error_digest(e)
            raise
        self.digest = digest(reply)
        return reply

    # --- the watchdog ------------------------------------------------------------------------
    def submit(self, fn, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if self.lost is not None:
            from kernels.group import GroupLost

            failed = loop.create_future()
            failed.set_exception(GroupLost(self.lost))
            return failed
        self._queued += 1
        future = loop.run_in_executor(self._thread, self._timed, fn, *args)
        future.add_done_callback(self._finished)
        return future

    def _timed(self, fn, *args) -> Any:
        """On the thread: what runs now and since when, for the heartbeat's watchdog."""
        self._running = (type(args[0]).__name__ if args else fn.__name__, time.monotonic())
        try:
            return fn(*args)
        finally:
            self._running = None

    def _finished(self, future: asyncio.Future) -> None:
        self._queued -= 1
        self._idle_since = time.monotonic()
        if not future.cancelled() and self._is_lost(future.exception()):
            self.declare_lost(str(future.exception()))

    async def on_thread(self, fn, *args) -> Any:
        """As ModelOwner's, but a lost group ends the wait at once (the thread may never return)."""
        future = self.submit(fn, *args)
        await asyncio.wait({future, self._lost}, return_when=asyncio.FIRST_COMPLETED)
        if not future.done():
            future.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it now
            raise self._lost.exception()
        if (error := future.exception()) is not None and not self._is_lost(error) and fn == self.execute:
            self._probe()  # a collective may have failed inside the forward: is the group still there?
        return future.result()

    def _probe(self) -> None:
        """A heartbeat nobody awaits: a lost group shows in its result (_finished)."""
        self.submit(self.execute, Heartbeat()).add_done_callback(lambda f: f.cancelled() or f.exception())

    def _is_lost(self, error: BaseException | None) -> bool:
        from kernels.group import GroupLost

        return isinstance(error, GroupLost)

    async def _heartbeat(self) -> None:
        every, timeout = self.group.heartbeat_s, self.group.timeout_s
        parent = os.getppid()
        while True:
            await asyncio.sleep(every)
            if os.getppid() != parent:  # mlx.launch died (it leaves its ranks running): shut down
                silence()
                os.kill(os.getpid(), signal.SIGTERM)
                parent = os.getppid()
            if self.lost is not None:
                continue  # a lost group is not checked again, the launcher still is
            running = self._running
            if running is not None and time.monotonic() - running[1] > timeout:
                self.declare_lost(f"distributed group lost: {running[0]} made no progress on every rank in "
                                  f"{timeout:g} s (a rank hangs or its network is down)")
            elif self._queued == 0 and time.monotonic() - self._idle_since >= every:
                self._probe()

    def declare_lost(self, reason: str) -> None:
        from kernels.group import GroupLost

        if self.lost is not None:
            return
        self.lost = self.stopped_reason = reason  # every later asker is told why
        self.log.error("group_lost", reason=reason)
        self._lost.set_exception(GroupLost(reason))
        self._lost.exception()  # retrieved: on_thread re-raises it
        self.tell_nowait(Describe())  # wakes the loop, which then stops (dispatch)

    async def dispatch(self, msg, reply) -> None:
        await super().dispatch(msg, reply)
        if self.lost is not None:
            from kernels.group import GroupLost

            raise GroupLost(self.lost)  # the system fails every in-flight request and reports it

    async def teardown(self) -> None:
        if self._beat is not None and self.lost is None:  # after a loss it still watches the launcher
            self._beat.cancel()
        if self.lost is None and self.engine is not None:
            try:
                await asyncio.wait_for(self.on_thread(self.execute, StopFollowers()), self.group.timeout_s)
            except Exception as e:  # noqa: BLE001  (stopping anyway)
                self.log.warning("followers_not_stopped", error=repr(e))
        if self.lost is None:
            return await super().teardown()
        self._thread.shutdown(wait=False, cancel_futures=True)  # its thread may be stuck in a collective

    def describe_group(self) -> dict:
        """For /health: the group's layout, ranks, state and what its communication costs."""
        channel = self.channel
        if channel is None:
            return {"enabled": True, "state": "starting"}
        return {"enabled": True, "state": "lost" if self.lost else "ok", "lost": self.lost,
                "size": channel.size, "parallel": self.layout, "pids": self.pids,
                "commands": channel.commands,
                "command_ms": round(1e3 * channel.seconds / max(channel.commands, 1), 4),
                "collectives_ms": self.collectives_ms, "timeout_s": self.group.timeout_s}


def with_seeds(msg):
    """A sampled prefill without a seed gets one here, so every rank draws the same random keys."""
    if isinstance(msg, Prefill) and msg.params.temperature > 0 and msg.params.seed is None:
        params = msgspec.structs.replace(msg.params, seed=secrets.randbits(63))
        return msgspec.structs.replace(msg, params=params)
    if isinstance(msg, PrefillChunk) and msg.items:
        return msgspec.structs.replace(msg, items=tuple(with_seeds(item) for item in msg.items))
    return msg
