"""Which row counts the few-rows kernel takes on this machine: timed against MLX's matmul once per
machine, BLAS, build and model shapes, and kept for every later process (kernels/rows_matmul.py).

A verdict is timed once and kept, so one noisy timing would route every server on the machine for
good: on a 2-core AMD EPYC a verdict timed while another process held a core left 2 rows (a depth-1
verify) to MLX's matmul, where the kernel is ~8x faster, and a served depth-1 step cost 1.7x a
plain one instead of ~1.2x. Both paths' costs change smoothly with the row count, so a row count
whose verdict differs from a neighbour's is timed again (more repeats, every pair pooled) until it
stands or RETIMES run out: a true crossover (a BLAS's matrix-vector path winning 1-3 rows) keeps its
verdict, a stall's hole does not.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import mlx.core as mx

from kernels import rows_matmul

WIN_RATIO = 0.97  # the kernel takes a row count only when clearly faster: a tie keeps MLX's path
RETIMES = 3  # rounds of re-timing the row counts whose verdict differs from a neighbour's
# Bumped when the rule changes, so verdicts kept under an older one are timed again.
RULE = "retimed-neighbours-1"


def verdicts_path():
    return rows_matmul.BUILD_ROOT / "rows-verdicts.json"


def rows_for(weights: list[mx.array]) -> frozenset[int]:
    """The verdict kept for this machine, BLAS, build and these shapes, else timed now and kept
    (one verdict for every process: a noisy start cannot route one server differently)."""
    key = verdict_key(weights)
    verdicts = _read_verdicts()
    if key in verdicts:
        return frozenset(verdicts[key])
    rows = choose_rows(weights)
    verdicts[key] = sorted(rows)
    _write_verdicts(verdicts)
    return rows


def choose_rows(weights: list[mx.array], repeats: int = 5) -> frozenset[int]:
    """The row counts at which the kernel beats MLX's matmul on these weights on this machine: a
    median paired ratio under WIN_RATIO, a count that disagrees with a neighbour re-timed. (A BLAS
    may have a matrix-vector path that wins for 1-3 rows and pack the weights from 4; the kernel's
    per-call start costs show only when the small products are timed with the large.)"""
    pairs = _paired(weights, None, repeats)
    for round_ in range(RETIMES):
        doubtful = _disagreeing({rows: statistics.median(p) < WIN_RATIO for rows, p in pairs.items()})
        if not doubtful:
            break
        for rows, timed in _paired(weights, doubtful, repeats * (round_ + 2)).items():
            pairs[rows] += timed
    return frozenset(rows for rows, p in pairs.items() if statistics.median(p) < WIN_RATIO)


def row_ratios(weights: list[mx.array], repeats: int = 5) -> dict[int, float]:
    """Per row count 1..MAX_ROWS, the kernel's time over MLX's matmul (median of paired calls)."""
    return {rows: statistics.median(p) for rows, p in _paired(weights, None, repeats).items()}


def _disagreeing(wins: dict[int, bool]) -> list[int]:
    """Row counts whose verdict differs from the count before or after it."""
    return [r for r in wins if any(wins.get(n, wins[r]) != wins[r] for n in (r - 1, r + 1))]


def _paired(weights: list[mx.array], counts, repeats: int) -> dict[int, list[float]]:
    """Per row count (all 1..MAX_ROWS where counts is None), `repeats` paired ratios: every weight
    multiplied once, as a step does, by both paths back to back in alternating order."""
    module = rows_matmul.load()
    if module is None:
        return {}
    found = {}
    for rows in counts or range(1, module.MAX_ROWS + 1):
        xs = {k: mx.random.normal((rows, k)) for k in {w.shape[1] for w in weights}}
        mx.eval(list(xs.values()))
        stock = lambda: mx.eval([xs[w.shape[1]] @ w.T for w in weights])  # noqa: E731
        mine = lambda: mx.eval([module.rows_matmul(xs[w.shape[1]], w) for w in weights])  # noqa: E731
        stock(), mine()  # warm: the first calls pay for page faults and thread starts
        found[rows] = [_paired_ratio(mine, stock, mine_first=i % 2 == 1) for i in range(repeats)]
    return found


def _paired_ratio(mine, stock, mine_first: bool) -> float:
    """mine's time over stock's, run back to back in the order given (alternated by the caller)."""
    if mine_first:
        ms_mine = _ms(mine)
        return ms_mine / _ms(stock)
    ms_stock = _ms(stock)
    return _ms(mine) / ms_stock


def _ms(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def verdict_key(weights: list[mx.array]) -> str:
    from kernels import BLAS
    from runtime.blas import hash_text

    shapes = " ".join(f"{a}x{b}" for a, b in sorted(tuple(w.shape) for w in weights))
    return f"{rows_matmul.build_key(rows_matmul.SOURCE)} | {BLAS.split(' ', 1)[0]} | {hash_text(shapes)} | {RULE}"


def _read_verdicts() -> dict:
    try:
        found = json.loads(verdicts_path().read_text())
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_verdicts(verdicts: dict) -> None:
    path = verdicts_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(verdicts, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only environment times the row counts at every start instead
