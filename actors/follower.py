"""A follower rank of a distributed group (every rank but 0): no HTTP and no actors. It loads its
part of the model as rank 0 does, then runs each command rank 0 broadcasts (kernels/group.py), in
order, through the model owner's own code (ModelOwner.execute), so its forwards meet rank 0's in
every collective. It answers nobody: rank 0 alone samples and replies, and checks this rank's
digest of each result against its own.

It exits 0 on StopFollowers (rank 0's shutdown) and 1 when rank 0 is gone: a collective fails (rank
0 died) or neither a command nor a prefill chunk's progress comes for timeout_s + heartbeat_s (rank 0
hangs; an idle rank 0 sends a heartbeat every heartbeat_s); and when its launcher dies (killed mlx.launch leaves its ranks
running). mlx.launch then stops the other ranks.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import structlog

from actors.model_owner import ModelOwner
from runtime.config import Config
from runtime.owner_messages import Heartbeat, StopFollowers


def follow(config: Config, model_dir: Path) -> int:
    from kernels.group import Channel, GroupLost, digest, error_digest, init_group
    from runtime.system import owner_args

    args, kwargs = owner_args(config, model_dir)
    owner = ModelOwner(*args, **kwargs)  # never started as an actor: its thread-side half alone
    owner.channel, owner.parallel = Channel(init_group()), config.distributed.parallel
    log = structlog.get_logger().bind(actor="follower", rank=owner.channel.rank)
    owner.info = owner._load()
    log.info("follower_ready", parallel=owner.layout, matmul=owner.info.matmul)
    watchdog = Watchdog(config.distributed.timeout_s + config.distributed.heartbeat_s, log)
    owner.engine.progress = watchdog.fed  # a long prefill is alive while its chunks advance
    mine = 0
    while True:
        try:
            msg = owner.channel.receive(mine)
        except GroupLost as e:
            log.error("follower_lost_rank_0", error=str(e))
            return 1
        watchdog.fed()
        if isinstance(msg, StopFollowers):
            owner.engine.close()
            log.info("follower_stopped", commands=owner.describe_timings())
            return 0
        if isinstance(msg, Heartbeat):
            continue
        try:
            mine = digest(owner.execute(msg))
        except Exception as e:  # noqa: BLE001  (rank 0 fails the same command the same way, or sees the digest)
            mine = error_digest(e)
            log.warning("follower_command_failed", command=type(msg).__name__, error=repr(e))


class Watchdog:
    """Ends the process when rank 0 sends nothing for `limit` seconds: the collective it would
    answer may never return, so only another thread can end the wait."""

    def __init__(self, limit: float, log):
        self.limit, self.log = limit, log
        self.last = time.monotonic()
        self.parent = os.getppid()  # mlx.launch (or the ssh session it started this rank from)
        threading.Thread(target=self._watch, name="follower-watchdog", daemon=True).start()

    def fed(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.limit / 4))
            if time.monotonic() - self.last > self.limit:
                self.log.error("follower_rank_0_silent", seconds=round(self.limit, 1))
            elif os.getppid() != self.parent:  # the launcher died: nothing will stop this rank
                silence()  # its pipes are gone with it
            else:
                continue
            sys.stderr.flush()
            os._exit(1)


def silence() -> None:
    """Point stdout and stderr at /dev/null: the launcher that read them has died, and every log
    line would raise BrokenPipeError in whatever logged it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
