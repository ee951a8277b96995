"""BLAS selection by measurement: MLX's CPU matrix products run on whichever BLAS is loaded first.

The mlx-cpu wheel bundles a reference BLAS (~2-6 GFLOP/s). Loading a tuned one with RTLD_GLOBAL
before `import mlx.core` makes MLX bind to it. Candidates: Intel's MKL (the `mkl` wheel on x86-64
Linux), the system OpenBLAS. Which is faster depends on the machine (MKL calls a matrix-vector kernel
for 1-3 rows where OpenBLAS packs the whole weight matrix first), so `auto` times both once per
machine in child processes (kernels/blas_probe.py) and keeps the verdict beside the environment.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

CHOICES = ("auto", "mkl", "openblas", "reference")
_OPENBLAS = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
)
PROBE = Path(__file__).parent.parent / "kernels" / "blas_probe.py"
VERDICT = Path(sys.prefix) / "metrale-blas.json"
_selected: str | None = None


def find_openblas() -> str | None:
    for path in _OPENBLAS:
        if Path(path).exists():
            return path
    return ctypes.util.find_library("openblas")


def find_mkl() -> str | None:
    """The MKL runtime the `mkl` wheel puts in the environment's lib folder."""
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    return found[0] if found else None


def candidates() -> dict[str, str]:
    """Tuned BLAS libraries present here, by name."""
    found = {"mkl": find_mkl(), "openblas": find_openblas()}
    return {name: path for name, path in found.items() if path}


def select_blas(choice: str = "auto") -> str:
    """Load the chosen BLAS unless MLX is imported already; returns what MLX uses. The first call
    decides: later calls (every `import kernels`) return the same."""
    global _selected
    if _selected is not None:
        return _selected
    if choice not in CHOICES:
        raise ValueError(f"blas must be one of {', '.join(CHOICES)}, not {choice!r}")
    if sys.platform == "darwin":
        _selected = "accelerate"
    elif "mlx.core" in sys.modules:
        _selected = "reference (mlx imported before BLAS selection)"
    elif choice == "reference":
        _selected = "reference (bundled with mlx)"
    else:
        _selected = _load(choice)
    return _selected


def _load(choice: str) -> str:
    found = candidates()
    if choice == "auto":
        name, why = measured_choice(found)
    else:
        name, why = choice, "asked for"
    if name not in found:
        return f"reference ({choice} not found)" if name else "reference (no tuned BLAS found)"
    try:
        ctypes.CDLL(found[name], mode=ctypes.RTLD_GLOBAL)
    except OSError as e:  # a broken install runs on the bundled BLAS, slowly, and says so
        print(f"metrale: cannot load {found[name]} ({e}); using the reference BLAS", file=sys.stderr)
        return f"reference ({name} failed to load)"
    return f"{name} ({found[name]}; {why})"


def measured_choice(found: dict[str, str]) -> tuple[str | None, str]:
    """The faster candidate on this machine: from the saved verdict, or timed now and saved."""
    if len(found) < 2:
        return next(iter(found), None), "the only one present"
    key = machine_key(found)
    saved = _read_verdict()
    if saved.get("key") == key:
        return saved["chosen"], _reason(saved["ms"])
    usable: dict[str, float] = {}
    for _ in range(2):  # two interleaved passes, so a burst of other load hits both alike
        for name, path in found.items():
            if (ms := probe(path)) is not None:
                usable[name] = min(ms, usable.get(name, ms))
    if not usable:
        return None, "no candidate ran"
    chosen = min(usable, key=usable.get)
    _write_verdict({"key": key, "chosen": chosen, "ms": usable})
    return chosen, _reason(usable)


def probe(path: str) -> float | None:
    """ms of one decode-shaped workload with this BLAS loaded (a child process; None if it fails)."""
    try:
        out = subprocess.run([sys.executable, str(PROBE), path], capture_output=True, text=True, timeout=120,
                             check=True)
        return float(json.loads(out.stdout.strip().splitlines()[-1])["ms"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError):
        return None


def machine_key(found: dict[str, str]) -> str:
    """What the verdict depends on: this CPU (its model and feature flags), core count, the libraries."""
    cpu = platform.processor()
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
        cpu = " ".join(sorted({ln.split(":", 1)[1].strip() for ln in lines
                               if ln.split(":", 1)[0].strip() in ("model name", "flags")}))
    except OSError:
        pass
    libs = ";".join(f"{n}={Path(p).resolve()}" for n, p in sorted(found.items()))
    return f"{platform.machine()} | {os.cpu_count()} cpus | {hash_text(cpu)} | {libs}"


def hash_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _reason(ms: dict[str, float]) -> str:
    return "measured here: " + ", ".join(f"{n} {t:.1f} ms" for n, t in sorted(ms.items(), key=lambda kv: kv[1]))


def _read_verdict() -> dict:
    try:
        return json.loads(VERDICT.read_text())
    except (OSError, ValueError):
        return {}


def _write_verdict(verdict: dict) -> None:
    try:
        tmp = VERDICT.with_name(VERDICT.name + ".tmp")
        tmp.write_text(json.dumps(verdict, indent=2) + "\n")
        os.replace(tmp, VERDICT)
    except OSError:
        pass  # a read-only environment times the candidates at every start instead
