"""A real `metrale serve` on loopback with the default model, shared by the integration tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_PENDING = 3  # small, so the queue-full test needs few requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


class ServerProcess:
    def __init__(self, tmp: Path, max_pending: int = MAX_PENDING, extra: tuple[str, ...] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / f"server-{self.port}.toml"
        config.write_text(f"[admission]\nmax_pending = {max_pending}\n")
        self.log_path = tmp / f"server-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli", "serve", "--config", str(config), "--port", str(self.port),
             *extra],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self.log_path.open("w"),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                get_json(self.url + "/health", timeout=1.0)
                return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"server not ready in {timeout}s: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text()

    def events(self, request_id: str) -> list[dict]:
        """The JSON trace lines the server wrote about one request (the log is shared by tests)."""
        lines = (line for line in self.log().splitlines() if line.startswith("{"))
        return [e for e in map(json.loads, lines) if e.get("request_id") == request_id]

    def counter(self, name: str) -> float:
        return self.health()["telemetry"]["counters"].get(name, 0)

    def health(self) -> dict:
        return get_json(self.url + "/health")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        else:  # it died under a test: its last words, to the failing test's report (pytest rotates tmp away)
            print(f"server exited {self.proc.returncode} before stop; log tail:\n{self.log()[-4000:]}", file=sys.stderr)
        return self.proc.wait(timeout)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from kernels.default_model import ensure_default_model

    return ensure_default_model()


@pytest.fixture(scope="session")
def server(model_dir, tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("server"))
    yield proc
    proc.stop()


@pytest.fixture
def idle_server(server):
    """The shared server, once no request of an earlier test is still in it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sched = server.health()["scheduler"]
        if sched["active"] == 0 and sched["waiting"] == 0:
            return server
        time.sleep(0.1)
    raise TimeoutError("server still busy with an earlier test's requests")
