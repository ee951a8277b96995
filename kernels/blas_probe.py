"""Standalone (run by path, never imported): `python blas_probe.py LIBRARY` loads that BLAS before
MLX, times decode-shaped matrix products, and prints {"ms": ...} as its last line.

The workload is a decode step's products at the default model's shapes (q, k, v, o, gate, up, down
of 8 layers with their own weights, then the LM head), at 1, 2 and 4 rows: a plain step and the
verify steps of one and three drafts. runtime/blas.py picks the library with the smallest sum.
"""

import ctypes
import json
import statistics
import sys
import time

ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # before mlx binds its BLAS symbols

import mlx.core as mx  # noqa: E402

HIDDEN, KV, MLP, VOCAB, LAYERS = 576, 192, 1536, 49152, 8
LAYER_SHAPES = ((HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN),
                (MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP))


def weights() -> list[mx.array]:
    shapes = [s for _ in range(LAYERS) for s in LAYER_SHAPES] + [(VOCAB, HIDDEN)]
    ws = [mx.full(s, 0.01, dtype=mx.float32) for s in shapes]
    mx.eval(ws)
    return ws


def step(ws: list[mx.array], rows: int) -> None:
    x, wide = mx.full((rows, HIDDEN), 0.5), mx.full((rows, MLP), 0.5)
    mx.eval([(wide if w.shape[1] == MLP else x) @ w.T for w in ws])


def median_ms(ws: list[mx.array], rows: int, repeats: int = 7) -> float:
    step(ws, rows)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step(ws, rows)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


if __name__ == "__main__":
    ws = weights()
    per_rows = {rows: median_ms(ws, rows) for rows in (1, 2, 4)}
    print(json.dumps({"ms": sum(per_rows.values()), "by_rows": per_rows}))
