"""The calibration table the measured planner reads (spec/plan.md), written by `metrale calibrate`.

Cells: verify[i][j] and draft[i][j] hold the median wall ms and joules of verifying / drafting at
batch width widths[i] and depth depths[j] (depth = drafts per sequence; depth 0 is a plain step).
Between measured points cost is piecewise linear: in depth, so a batch of R rows over n sequences
costs the width's cells at depth R / n; and in width, for widths calibrate did not measure.
Beyond the last measured point cost follows the last segment's slope but never drops below that
point (the grid is not monotone, and extrapolating a falling segment would make depth look free).

The acceptance calibration maps a drafter's confidence c (top-1 log-probability) to P(accept):
piecewise linear through measured (confidence, acceptance) knots, flat beyond the end knots, and
exp(c) when there are no knots. by_depth[t-1] is the acceptance observed at draft position t.
"""

from __future__ import annotations

import bisect
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Callable, Sequence

import msgspec

SCHEMA_VERSION = 1


class CostTableError(Exception):
    """A calibration table that cannot be used."""


class TableNotFoundError(CostTableError):
    """No table at the path: run `metrale calibrate`."""


class TableFormatError(CostTableError):
    """The file is not a valid table of this schema version."""


class TableMismatchError(CostTableError):
    """The table was measured for another model or machine."""

    def __init__(self, path: Path, field: str, expected: str, found: str) -> None:
        self.path, self.field, self.expected, self.found = path, field, expected, found
        super().__init__(
            f"cost table {path} was measured for {field} {found!r}, not {expected!r}; "
            f"run `metrale calibrate` on this {field}"
        )


class Cost(msgspec.Struct, frozen=True, kw_only=True):
    ms: float
    joules: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(ms=self.ms + other.ms, joules=self.joules + other.joules)


class TableMeta(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: int = SCHEMA_VERSION
    model_id: str
    drafter: str
    machine: str
    dtype: str
    blas: str
    energy_source: str  # "rapl" | "cpu_proxy" (runtime/energy.py) | "powermetrics"
    watts_per_core: float | None = None  # set when energy_source is "cpu_proxy"
    date: str  # ISO 8601, UTC


class AcceptanceCalibration(msgspec.Struct, frozen=True, kw_only=True):
    confidence: tuple[float, ...] = ()  # knots: top-1 log-probabilities, strictly ascending
    acceptance: tuple[float, ...] = ()  # observed P(accept) at each knot
    by_depth: tuple[float, ...] = ()  # observed P(accept) at draft position 1, 2, ...

    def p_accept(self, confidence: float) -> float:
        """P(a draft with this top-1 log-probability is accepted)."""
        if not self.confidence:
            return min(1.0, max(0.0, math.exp(confidence)))
        return _interp_clamped(self.confidence, self.acceptance, confidence)


class CostTable(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    # dict=True: a per-instance cache of interpolated width rows (not a field: never encoded or compared)
    meta: TableMeta
    widths: tuple[int, ...]  # ascending batch widths
    depths: tuple[int, ...]  # ascending depths; 0 always present
    verify: tuple[tuple[Cost, ...], ...]  # verify[width index][depth index]
    draft: tuple[tuple[Cost, ...], ...]  # draft[width index][depth index]
    calibration: AcceptanceCalibration = AcceptanceCalibration()

    def verify_row(self, n: int) -> tuple[Cost, ...]:
        """Verify cost at width n for each of self.depths."""
        return self._row("verify", n)

    def draft_row(self, n: int) -> tuple[Cost, ...]:
        return self._row("draft", n)

    def _row(self, kind: str, n: int) -> tuple[Cost, ...]:
        # The planner asks every sequence's depth each step: interpolate each width once per table.
        rows = self.__dict__.setdefault("_rows", {})
        if (kind, n) not in rows:
            rows[kind, n] = _width_row(self.widths, getattr(self, kind), n)
        return rows[kind, n]

    def verify_cost(self, n: int, depth: float) -> Cost:
        return cost_at_depth(self.depths, self.verify_row(n), depth)

    def draft_cost(self, n: int, depth: float) -> Cost:
        return cost_at_depth(self.depths, self.draft_row(n), depth)

    def step_cost(self, n: int, depth: float) -> Cost:
        """A speculative step: draft then verify (a plain step at depth 0)."""
        return self.verify_cost(n, depth) + self.draft_cost(n, depth)


def make_table(
    *,
    meta: TableMeta,
    widths: Sequence[int],
    depths: Sequence[int],
    verify: Callable[[int, int], Cost],
    draft: Callable[[int, int], Cost],
    calibration: AcceptanceCalibration = AcceptanceCalibration(),
) -> CostTable:
    """A table from cost functions (width, depth) -> Cost, such as calibrate's medians."""
    return CostTable(
        meta=meta,
        widths=tuple(widths),
        depths=tuple(depths),
        verify=tuple(tuple(verify(n, k) for k in depths) for n in widths),
        draft=tuple(tuple(draft(n, k) for k in depths) for n in widths),
        calibration=calibration,
    )


def cost_at_depth(depths: Sequence[int], row: Sequence[Cost], depth: float) -> Cost:
    """One width's row of cells, interpolated at a (possibly fractional) depth."""
    if depth in depths:  # a cell itself (what interpolation gives there): the planner asks ~60 a step
        return row[depths.index(depth)]
    ms = interpolate(depths, [c.ms for c in row], depth)
    joules = interpolate(depths, [c.joules for c in row], depth)
    return Cost(ms=ms, joules=joules)


def _width_row(widths: Sequence[int], grid, n: int) -> tuple[Cost, ...]:
    columns = zip(*grid)  # one column per depth, one cell per width
    return tuple(
        Cost(
            ms=interpolate(widths, [c.ms for c in col], n),
            joules=interpolate(widths, [c.joules for c in col], n),
        )
        for col in columns
    )


def _interp_clamped(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), flat beyond both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Cost at x from measured (xs, ys): piecewise linear, flat before xs[0], and past xs[-1]
    rising along the last slope (never falling below ys[-1])."""
    if x > xs[-1] and len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + max(0.0, slope) * (x - xs[-1])
    return _interp_clamped(xs, ys, x)


def validate_table(table: CostTable) -> None:
    """Raise TableFormatError unless the table is usable by the planner."""
    problems = _shape_problems(table) + _calibration_problems(table.calibration)
    if table.meta.schema_version != SCHEMA_VERSION:
        problems.insert(0, f"schema version {table.meta.schema_version}, expected {SCHEMA_VERSION}")
    if problems:
        raise TableFormatError("invalid cost table: " + "; ".join(problems))


def _shape_problems(table: CostTable) -> list[str]:
    problems = []
    if not table.widths or not _strictly_ascending(table.widths) or table.widths[0] < 1:
        problems.append("widths must be positive and strictly ascending")
    if not _strictly_ascending(table.depths) or 0 not in table.depths:
        problems.append("depths must be strictly ascending and include 0")
    for name, grid, floor in (("verify", table.verify, 0.0), ("draft", table.draft, None)):
        if len(grid) != len(table.widths) or any(len(r) != len(table.depths) for r in grid):
            problems.append(f"{name} must have one row per width and one cell per depth")
        elif not all(_cell_ok(c, floor) for row in grid for c in row):
            problems.append(f"{name} cells must be finite, and verify cells positive")
    return problems


def _cell_ok(cell: Cost, floor: float | None) -> bool:
    values = (cell.ms, cell.joules)
    if not all(math.isfinite(v) and v >= 0.0 for v in values):
        return False
    return floor is None or all(v > floor for v in values)


def _calibration_problems(cal: AcceptanceCalibration) -> list[str]:
    problems = []
    if len(cal.confidence) != len(cal.acceptance) or not _strictly_ascending(cal.confidence):
        problems.append("calibration knots must pair up and ascend strictly")
    if not all(0.0 <= p <= 1.0 for p in (*cal.acceptance, *cal.by_depth)):
        problems.append("calibration probabilities must lie in [0, 1]")
    return problems


def _strictly_ascending(xs: Sequence[float]) -> bool:
    return all(math.isfinite(x) for x in xs) and all(a < b for a, b in zip(xs, xs[1:]))


def load_table(
    path: Path | str, *, expect_model: str | None = None, expect_machine: str | None = None
) -> CostTable:
    """Read and check a table; refuse one measured for another model or machine."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TableNotFoundError(f"no cost table at {path}; run `metrale calibrate`") from None
    try:
        table = msgspec.json.decode(raw, type=CostTable)
    except msgspec.DecodeError as exc:
        raise TableFormatError(f"cost table {path} does not parse: {exc}") from exc
    validate_table(table)
    for field, expected, found in (
        ("model", expect_model, table.meta.model_id),
        ("machine", expect_machine, table.meta.machine),
    ):
        if expected is not None and expected != found:
            raise TableMismatchError(path, field, expected, found)
    return table


def save_table(table: CostTable, path: Path | str) -> None:
    """Write atomically (a temporary file renamed into place): an interrupt leaves no half table."""
    validate_table(table)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(table), indent=2) + b"\n")
    os.replace(tmp, path)


def machine_id(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """What a table's timings depend on: OS and architecture, CPU model, core count."""
    system = f"{platform.system()}-{platform.machine()}"
    return f"{system} | {_cpu_model(cpuinfo)} | {os.cpu_count()} cpus"


def _cpu_model(cpuinfo: Path) -> str:
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    if platform.system() == "Darwin":  # platform.processor() only says "arm" there
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True, text=True, timeout=5, check=True,
            )
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or "unknown cpu"
