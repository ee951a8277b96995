"""A real aiohttp server on 127.0.0.1, in process, over a System with a tiny model (milliseconds to
start), for tests that need a fault injected or a setting the shared server does not have."""

from __future__ import annotations

import logging
import socket
from contextlib import contextmanager

import aiohttp
import structlog
from structlog.testing import capture_logs
from aiohttp import web

from actors.model_owner import ModelOwner
from runtime.config import Config, override
from runtime.owner_messages import Decoded
from runtime.server import make_runner
from runtime.system import System

PROMPT = "t3 t4 t5 t6"  # the tiny model's word-level tokenizer reads it as one token


@contextmanager
def every_event():
    """structlog's capture_logs keeps the configured level filter, and a benchmark run earlier in this
    process (runtime/bench/common.py) sets it to warning: lift it, so info events are captured whatever ran before."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**saved)


def tiny_model(tmp_path_factory):
    from tests.tiny import save_tiny_dir

    return save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=3)



class FaultyOwner(ModelOwner):
    """The real owner; with `fault` set, a decode step of all three test requests raises ("raise") or
    replies junk ("junk"), so the fault hits them in flight, together."""

    fault: str | None = None

    def _decode(self, msg):
        if self.fault == "raise" and len(msg.seq_ids) == 3:
            raise RuntimeError("injected engine fault")
        if self.fault == "junk" and len(msg.seq_ids) == 3:
            return Decoded(tokens=None, seconds=0.0)  # the scheduler cannot step on this: it dies
        return super()._decode(msg)


class Served:
    """A System with a FaultyOwner behind the real aiohttp app on 127.0.0.1."""

    def __init__(self, model_dir, base: Config | None = None, **server):
        config = override(base or Config(), "scheduler", mode="mtp_batch", max_active_requests=4, batch_wait_ms=50.0)
        self.config = override(override(config, "spec", drafter="none", cost_model="off"), "server", **server)
        self.owner = FaultyOwner(model_dir, spec=self.config.spec, batched=True)
        self.system = System(self.config, model_dir, owner=self.owner)

    async def __aenter__(self):
        await self.system.start()
        self.runner = make_runner(self.system, self.config)
        await self.runner.setup()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        self.http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc):
        await self.http.close()
        await self.system.stop()
        await self.runner.cleanup()
