"""BLAS selection: load the system OpenBLAS with RTLD_GLOBAL before MLX so MLX's matmuls use it.

The mlx-cpu wheel bundles a reference BLAS (~2-6 GFLOP/s); OpenBLAS runs ~10x faster here, which is
what makes verify steps cheaper than K plain steps. Must run before the first `import mlx.core`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
)
_selected: str | None = None


def find_openblas() -> str | None:
    for path in _CANDIDATES:
        if Path(path).exists():
            return path
    return ctypes.util.find_library("openblas")


def select_blas() -> str:
    """Load OpenBLAS if present and MLX is not yet imported; returns what MLX will use."""
    global _selected
    if _selected is not None:
        return _selected
    if sys.platform == "darwin":
        _selected = "accelerate"
    elif os.environ.get("METRALE_BLAS") == "reference":
        _selected = "reference (bundled with mlx)"
    elif "mlx.core" in sys.modules:
        _selected = "reference (mlx imported before BLAS selection)"
    elif (path := find_openblas()) is None:
        _selected = "reference (no system OpenBLAS found)"
    else:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        _selected = f"openblas ({path})"
    return _selected
