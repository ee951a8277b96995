"""A short self-calibration for a server that finds no cost table of this machine's.

The cells of a small table (widths 1, 2, 4; depths 0..K) are timed a few times each, one call at a
time, only while the server is idle, so a request arriving waits for one call (~0.1-0.3 s) at
most. Calls go round-robin over the cells, so a slow spell hits every cell alike. With no table at
all, when every cell has its repeats, the medians make a table (acceptance from the drafter-agnostic
default prior, corrected online per phase) and the online controller starts from it.

With a table measured elsewhere (shipped, or another machine's), the controller starts from that at
once and the same calls check it (`checks`): each, after a shape's first (which traces its compiled
graphs), is a measurement of its cell fed to the online cost model, every speculative cell timed
between plain steps of its width. Served steps alone measured only the cells the planner chose: on
a 2-core AMD EPYC a fresh server read the shipped Xeon table's depth-1 step at 1.34x plain decode
(its shape and the caution about a cell measured elsewhere) where it cost 1.14x, and decoded the
first third of the chat prompts plainly; depths 2 and 3, never chosen, stayed read at 1.6x and 2.1x
where they cost 1.36x and 1.45x, and code stayed at depth 1 where depth 3 paid 1.40x against 1.33x.
A check times only the widths this server decodes at (`checked_widths`), depth by depth from the
shallowest: a serial server's idle moments come one per request in a bench, and with every cell
once per round over widths 1, 2 and 4, width 1's depth-1 cell got its first fed measurement after
~31 of them, past the whole chat set; now after 6.

Pure: the scheduler runs the calls on the model owner and hands each result in.
"""

from __future__ import annotations

import datetime
import statistics

from runtime.acceptance_online import DEFAULT_PRIOR
from runtime.cost_table import AcceptanceCalibration, Cost, CostTable, TableMeta, make_table

WIDTHS = (1, 2, 4)
REPEATS = 3
CHECK_REPEATS = 6  # the first call of each shape traces: five measurements of each cell are fed
SELF_CALIBRATED = "self-calibration"


def checked_widths(widest: int) -> tuple[int, ...]:
    """The table's widths a check times for a server whose batches are at most `widest` rows."""
    return tuple(n for n in WIDTHS if n <= max(1, widest))


class SelfCalibration:
    def __init__(self, meta: TableMeta, max_k: int, widths=WIDTHS, repeats: int | None = None, checks: bool = False):
        self.meta, self.widths, self.depths, self.checks = meta, tuple(widths), tuple(range(max_k + 1)), checks
        cells = [("verify", n, k) for n in self.widths for k in self.depths]
        cells += [("draft", n, k) for n in self.widths for k in self.depths if k]
        rounds = repeats or (CHECK_REPEATS if checks else REPEATS)
        # Every cell once before any twice, so a slow spell hits every cell alike; a check goes depth by
        # depth instead, each speculative cell between plain steps of its width (what its ratio is
        # learned against), the shallowest first: the cell the planner's first decisions turn on.
        self.queue = self._check_queue(rounds) if checks else cells * rounds
        self.total = len(self.queue)
        self.samples: dict[tuple, list[tuple[float, float]]] = {cell: [] for cell in cells}

    def _check_queue(self, rounds: int) -> list[tuple[str, int, int]]:
        """Per width, per depth from 1 up, `rounds` times: plain, verify at that depth, its draft; a
        plain step closes each width's run."""
        cells = []
        for n in self.widths:
            for k in self.depths[1:]:
                cells += [("verify", n, 0), ("verify", n, k), ("draft", n, k)] * rounds
            cells.append(("verify", n, 0))
        return cells

    def measures(self, cell: tuple[str, int, int]) -> bool:
        """Whether the latest recorded call of this cell is a measurement to feed a checked prior (a
        shape's first call traces compiled graphs: not its cost)."""
        return self.checks and len(self.samples[cell]) > 1

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
        return {"running": not self.done, "cells_left": len(self.queue), "cells": self.total,
                "role": "checks the prior" if self.checks else "makes the prior"}


def _fields(meta: TableMeta) -> dict:
    import msgspec

    return msgspec.structs.asdict(meta)
