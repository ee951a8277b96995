"""Plumbing for `metrale bench serve`: a `metrale serve` subprocess on loopback, and timed
non-streaming chat requests through the official openai client."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runtime.bench.serving import _free_port

ROOT = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "runtime.cli", "serve"]
WARM_UP = "Say hello in one short sentence."  # not in either prompt set


def serve_accepts(flag: str) -> bool:
    """Whether this checkout's `metrale serve` has the flag (read once from its help text)."""
    out = subprocess.run(SERVE + ["--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return flag in out.stdout


class ServedProcess:
    """`metrale serve` in a subprocess on 127.0.0.1 with a fresh cache folder, so no cost table
    learned by an earlier run is found; stopped with SIGTERM, killed if it does not exit."""

    def __init__(self, model_dir: Path, extra: list[str], ready_timeout: float = 180.0, port: int = 0):
        """port 0: a free loopback port."""
        self.model_dir, self.extra, self.ready_timeout = model_dir, list(extra), ready_timeout
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def command(self, cache_dir: str) -> list[str]:
        return SERVE + ["--model", str(self.model_dir), "--cache-dir", cache_dir, "--host", "127.0.0.1",
                        "--port", str(self.port), *self.extra]

    def __enter__(self) -> "ServedProcess":
        self.tmp = tempfile.mkdtemp(prefix="metrale-bench-serve-")
        self.log_path = Path(self.tmp) / "server.log"
        try:
            with self.log_path.open("w") as log:
                self.proc = subprocess.Popen(self.command(self.tmp), cwd=ROOT, stdout=subprocess.DEVNULL,
                                             stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None and exc_type is not KeyboardInterrupt:
                print(f"server log tail:\n{self.log_tail()}", file=sys.stderr)
            self._stop()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"metrale serve exited {self.proc.returncode}; log tail:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2.0) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"metrale serve not ready in {self.ready_timeout:.0f}s; log tail:\n{self.log_tail()}")

    def _stop(self, timeout: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)


@dataclass(frozen=True)
class Answer:
    seconds: float  # client side, request sent to body read
    tokens: int
    text: str
    receipt: dict  # usage.speculation as the server sent it


@dataclass(frozen=True)
class Batch:
    """Requests sent together (one at --clients 1): the group's wall seconds and each answer."""

    seconds: float
    answers: tuple[Answer, ...]
    others: tuple[Answer, ...] = ()  # the other repeats' answers (fastest() keeps them for identity checks)

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.answers)

    @property
    def every_answer(self) -> tuple[Answer, ...]:
        """This batch's answers, then each other repeat's, prompt order within each."""
        return self.answers + self.others


def fastest(tries: list[Batch]) -> Batch:
    """The fastest of a leg's repeats, carrying the others' answers."""
    best = min(tries, key=lambda b: b.seconds)
    rest = tuple(a for b in tries if b is not best for a in b.every_answer)
    return Batch(best.seconds, best.answers, rest)


def openai_client(url: str):
    import openai

    # No retries: a retried request would hide a server error and count twice in the timing.
    return openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=600.0, max_retries=0)


def ask(client, prompt: str, max_tokens: int, disable_mtp: bool, fields: dict | None = None) -> Answer:
    extra = (fields or {}) | ({"disable_mtp": True} if disable_mtp else {}) or None
    started = time.perf_counter()
    resp = client.chat.completions.create(model="default", messages=[{"role": "user", "content": prompt}],
                                          max_tokens=max_tokens, temperature=0, stream=False, extra_body=extra)
    seconds = time.perf_counter() - started
    receipt = (resp.usage.model_extra or {}).get("speculation") or {}
    return Answer(seconds, resp.usage.completion_tokens, resp.choices[0].message.content or "", dict(receipt))


def ask_all(pool: ThreadPoolExecutor, client, prompts: list[str], max_tokens: int, disable_mtp: bool,
            fields: dict | None = None) -> Batch:
    """Every prompt at once, one pool thread each; the group's wall time covers them all."""
    started = time.perf_counter()
    futures = [pool.submit(ask, client, p, max_tokens, disable_mtp, fields) for p in prompts]
    answers = tuple(f.result() for f in futures)
    return Batch(time.perf_counter() - started, answers)


def warm_up(client, max_tokens: int, plain_too: bool) -> None:
    """Two untimed requests: the first runs page weights in and build each code path once. Then the
    server's start-up check of its cost prior is let finish while the machine is quiet."""
    ask(client, WARM_UP, max_tokens, disable_mtp=False)
    ask(client, WARM_UP, max_tokens, disable_mtp=plain_too)
    wait_checked(str(client.base_url).rstrip("/").removesuffix("/v1"))


def scheduler_state(url: str) -> dict:
    """The scheduler's part of the server's /health."""
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        return json.loads(r.read()).get("scheduler") or {}


def wait_checked(url: str, timeout: float = 120.0) -> float:
    """Seconds until the server's self-calibration (or its check of a prior) has finished.

    It runs in the server's idle moments and cannot tell another process's work from its own cost:
    a bench that started the next server (loading, warming) while this one checked had it time its
    cells on a shared machine (on a 2-core AMD EPYC a check beside a busy core read a depth-1 step
    at 1.31x plain decode, alone 1.17x), which a user's one server on a quiet machine does not get.
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not scheduler_state(url).get("self_calibration"):
            return time.monotonic() - started
        time.sleep(0.2)
    raise TimeoutError(f"{url}: the start-up check of the cost prior did not finish in {timeout:.0f}s")
