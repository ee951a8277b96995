"""`metrale serve --distributed` under `mlx.launch --backend ring -n N` on loopback, for `metrale
bench distributed` and the tests: rank 0's server on 127.0.0.1, its group's process ids from
/health, stopped by SIGTERM to rank 0 (whose shutdown stops the other ranks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from runtime.bench._served import SERVE, ServedProcess
from runtime.bench.serving import _free_port

# mlx's own launcher, run by this interpreter (its console script is a two-line wrapper of this).
MLX_LAUNCH = [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; sys.exit(main())"]


def ring_available() -> str | None:
    """Why a ring group cannot start here, or None."""
    import importlib.util

    try:
        found = importlib.util.find_spec("mlx._distributed_utils.launch") is not None
    except ImportError:
        found = False
    return None if found else "mlx's launcher (mlx._distributed_utils.launch) is not installed"


class LaunchedGroup(ServedProcess):
    """With `hostfile`, the ranks are named in a hosts.json (every one 127.0.0.1) instead of `-n`."""

    def __init__(self, model_dir, extra: list[str], ranks: int = 2, ready_timeout: float = 240.0,
                 hostfile: bool = False):
        super().__init__(model_dir, extra, ready_timeout)
        self.ranks, self.hostfile = ranks, hostfile
        self.ring_port = _free_port()  # ranks listen on ring_port, ring_port + 1, ...

    def command(self, cache_dir: str) -> list[str]:
        serve = super().command(cache_dir)[len(SERVE):]
        if self.hostfile:
            path = Path(cache_dir) / "hosts.json"
            path.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * self.ranks))
            hosts = ["--hostfile", str(path)]
        else:
            hosts = ["-n", str(self.ranks)]
        # The ranks share this machine's cores: Intel OpenMP's threads (MKL's) must not spin after
        # their work (200 ms by default) while another rank's stage waits for a core.
        return [*MLX_LAUNCH, "--backend", "ring", *hosts, "--starting-port", str(self.ring_port),
                "--env", "KMP_BLOCKTIME=0", "--", *SERVE, "--distributed", *serve]

    def health(self) -> dict:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5.0) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 503: degraded or draining, still a health report
            return json.loads(e.read())

    def _wait_ready(self) -> None:
        super()._wait_ready()
        self.started_pids = self.pids  # kept: a rank that ends up hung still gets killed at the end

    @property
    def pids(self) -> list[int]:
        return self.health()["distributed"]["pids"]

    def signal_rank(self, rank: int, sig: int) -> None:
        os.kill(self.pids[rank], sig)

    def wait_exit(self, timeout: float) -> int | None:
        """The launcher's exit code once every rank has ended, or None if they have not in time."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _stop(self, timeout: float = 60.0) -> None:
        pids = getattr(self, "started_pids", [])
        if self.proc is not None and self.proc.poll() is None and pids:
            _kill(pids[0], signal.SIGTERM)
        if self.proc is not None and self.wait_exit(timeout) is None:
            self.proc.kill()
            self.proc.wait(timeout)
        for pid in pids:  # never leave a rank behind (a killed launcher leaves them running)
            if not wait_until(lambda: not self._is_rank(pid), 5):
                _kill(pid)

    def _is_rank(self, pid: int) -> bool:
        """Whether pid is still one of this group's ranks (not a process that reused the id)."""
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return b"--distributed" in args and str(self.port).encode() in args


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def wait_until(predicate, timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False
