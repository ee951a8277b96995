"""Helpers shared by benchmarks: an in-process actor system, a median, a table."""

from __future__ import annotations

import statistics

from runtime.config import Config, load_config


async def started_system(config: Config | None = None, model_dir=None):
    from kernels.default_model import ensure_default_model
    from runtime.system import System
    from runtime import tracing

    tracing.configure("json", level="warning")  # benchmarks print tables, not event logs
    system = System(config or load_config(), model_dir or ensure_default_model())
    await system.start()
    return system


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells)
