"""A short self-calibration for a server that finds no cost table: the prior of its online cost model.

The cells of a small table (widths 1, 2, 4; depths 0..K) are timed a few times each, one call at a
time, only while the server is idle, so a request arriving waits for one call (~0.1-0.3 s) at
most. Calls go round-robin over the cells, so a slow spell hits every cell alike. When every cell
has its repeats, the medians make a table (acceptance from the drafter-agnostic default prior,
corrected online per phase) and the online controller starts from it.

Pure: the scheduler runs the calls on the model owner and hands each result in.
"""

from __future__ import annotations

import datetime
import statistics

from runtime.acceptance_online import DEFAULT_PRIOR
from runtime.cost_table import AcceptanceCalibration, Cost, CostTable, TableMeta, make_table

WIDTHS = (1, 2, 4)
REPEATS = 3
SELF_CALIBRATED = "self-calibration"


class SelfCalibration:
    def __init__(self, meta: TableMeta, max_k: int, widths=WIDTHS, repeats: int = REPEATS):
        self.meta, self.widths, self.depths = meta, tuple(widths), tuple(range(max_k + 1))
        cells = [("verify", n, k) for n in self.widths for k in self.depths]
        cells += [("draft", n, k) for n in self.widths for k in self.depths if k]
        self.queue = cells * repeats  # round-robin: every cell once before any cell twice
        self.total = len(self.queue)
        self.samples: dict[tuple, list[tuple[float, float]]] = {cell: [] for cell in cells}

    @property
    def done(self) -> bool:
        return not self.queue

    def next_cell(self) -> tuple[str, int, int] | None:
        return self.queue[0] if self.queue else None

    def record(self, cell: tuple[str, int, int], ms: float, joules: float) -> None:
        if self.queue and self.queue[0] == cell:
            self.queue.pop(0)
            self.samples[cell].append((ms, joules))

    def table(self) -> CostTable:
        """The medians as a table (only once done)."""
        assert self.done, "the self-calibration has cells left"

        def cell(kind):
            def cost(n, k):
                if kind == "draft" and k == 0:
                    return Cost(ms=0.0, joules=0.0)
                runs = self.samples[kind, n, k]
                return Cost(ms=statistics.median(r[0] for r in runs), joules=statistics.median(r[1] for r in runs))
            return cost

        meta = TableMeta(**{**_fields(self.meta), "date": datetime.datetime.now(datetime.UTC)
                            .isoformat(timespec="seconds")})
        return make_table(meta=meta, widths=self.widths, depths=self.depths, verify=cell("verify"),
                          draft=cell("draft"), calibration=AcceptanceCalibration(by_depth=DEFAULT_PRIOR))

    def snapshot(self) -> dict:
        return {"running": not self.done, "cells_left": len(self.queue), "cells": self.total}


def _fields(meta: TableMeta) -> dict:
    import msgspec

    return msgspec.structs.asdict(meta)
