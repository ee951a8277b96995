"""The online cost model: every served step corrects the planner's cost table (runtime/cost_table.py).

A prior table (this machine's, another machine's, or a short self-calibration) gives each cell's
shape; served steps give its scale here. Plain decode, measured at nearly every step, is the
reference: its log-ratio of measured to prior cost is learned over all widths and per width (each
shrunk toward the one above by its count). A speculative cell (verify at depth >= 1, a draft)
learns its cost relative to plain decode's estimate at the time of its step, beyond the prior's own
ratio between the two, at three levels: the whole kind, one batch width, one (width, depth) cell.
Its cost is read as plain decode's now times that ratio. So on a machine twice as fast as the
prior's, a hundred plain steps halve every cell, the cells that were measured themselves follow
their own ratio to plain, and what the planner reads, a depth's cost over plain decode's, is the
one measured.

Each level is a `RobustEstimate` (runtime/robust_estimate.py): a centre, a spread and a count, that
one outlier cannot move far and that follows a machine whose speed drifts.

The machine's speed also drifts faster than a cell can follow: on a shared 2-core VM the plain step
ran 47 ms in one minute and 70 ms in the next. So plain decode's estimate is read at a common
`tempo` (a fast average, over ~TEMPO_MEMORY plain steps, of what the plain cells do not explain),
and a speculative cell is compared with plain decode at its own step's tempo: a 1.4x slow-down after
a cell was last measured biased its ratio to plain by 27% without the tempo, by ~1% with it
(tests/unit/test_online_estimators.py). Only plain steps move the tempo, and speculative cells learn
a ratio, not a level: speculative steps come in spells, and when every verify step moved the tempo
and every cell learned its level under it, the tempo explained a spell's cost away as the machine's
speed and a cell kept its prior's ratio to plain (on a 2-core AMD EPYC the live table read a depth-1
step as 1.13-1.29x a plain step while served spells ran at 1.57x, and chat speculated where it
lost). Drift during a long spell goes into that spell's cell, at 1/64 a step.

A spell's steps are learned once HOLD_PLAIN plain steps after it have moved the tempo, each at a
tempo between its own step's and the one after the spell (by its place in the spell): the machine's
speed during a spell is known only from the plain steps on both sides of it. Learned at the tempo
before it, a slow spell of the VM inside a speculative spell went whole into its cell: on a 2-core
AMD EPYC steps of one spell went from 33 to 48 ms, the depth-1 cell read 1.35x plain decode where
such steps cost 1.18x, and chat, which pays at 1.35x only from a first-draft acceptance of 0.35,
decoded plainly from then on, so the cell was never measured again. A long spell (past HOLD_MAX
steps) teaches its cell at its two ends only: its first SPELL_HEAD steps at the tempo before it,
its last HOLD_MAX at the flush; the steps between are dropped, since nothing tells the machine's
speed there from the cell's. Learned at the tempo before the spell, a slow spell of a 2-core Xeon VM
inside a 100-step speculative spell moved the depth-1 cell from 1.13x to 1.29x plain decode, and
chat decoded plainly for ~1,600 steps until ageing and exploration measured it again.

The planner reads `table()`: the estimates, except that where the prior came from elsewhere (shipped
or foreign) a speculative cell is read at an upper bound of its cost until this server has measured
it (CAUTION_Z); exploration reads the lower bounds (`optimistic_table()`), and what is saved and shown
is the estimates.

Pure: no clock, no I/O. The scheduler passes each step's wall ms and joules in.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from typing import Literal, NamedTuple

import msgspec

from runtime.cost_table import Cost, CostTable, TableMeta
from runtime.robust_estimate import SPREAD_FLOOR, SPREAD_START, RobustEstimate, shrunk
from runtime.self_calibration import SELF_CALIBRATED

Kind = Literal["verify", "draft"]

Z = 1.64  # one-sided 95%: how optimistic exploration is about a speculative cell's cost
# How cautious the plan is about a speculative cell this server has hardly measured, where its prior
# came from elsewhere (a shipped or foreign table): one spread over the root of its own count + 1,
# so an unmeasured cell costs ~28% more and one measured 30 times ~1-2%. On a 2-core Xeon the shipped
# table priced a width-7 depth-1 step at 1.1x a plain one where it cost 1.3x, and a fresh server's
# first width-8 run speculated in 59 steps at 0.86x plain; the exploration budget measures such
# cells instead, at its bounded cost.
CAUTION_Z = 1.0
CACHED = "cache"  # the origin of a prior this machine's servers learned (runtime/cost_prior.py)
OWN_PRIORS = (CACHED, SELF_CALIBRATED)  # measured by this machine's servers: no caution
# The planner's tables are rebuilt after this many observations, not after each: a rebuild prices
# every cell (0.7 ms of the actors' time a step at width 4), and one step moves a cell by ~1/64.
REBUILD_EVERY = 8
# Plain steps over which the common speed follows the machine: the faster it follows, the less of a
# change the cells take in before it does (a cell's own memory is MEMORY steps).
TEMPO_MEMORY = 4
TEMPO_CLIP = 0.25  # log units: a stall moves every cell alike by at most 6%, for a step or two
PLAIN_FIRST = 4  # plain steps measured before any speculative one: the reference they are learned against
HOLD_PLAIN = TEMPO_MEMORY  # plain steps after a spell before its steps are learned: the tempo has followed them
HOLD_MAX = 32  # speculative steps held at most: a longer spell's tail, learned at the flush
SPELL_HEAD = 16  # a long spell's first steps, learned at the tempo before it; the rest up to its tail are dropped
# A speculative level's evidence ages: each AGE_STEPS plain steps with none of its own halve its count
# (to AGED_FLOOR), so its lower bound widens, exploration measures it again, and those steps weigh
# as a fresh cell's do. Without it a cell measured high in a spell stayed so: the planner then chose
# plain decode, the cell's count (~300) let an exploring burst move it ~6%, and chat stayed plain.
AGE_STEPS = 256
AGED_FLOOR = 4


class OnlineCostModel:
    """Verify and draft costs by (width, depth), learned from served steps on top of a prior table."""

    def __init__(self, prior: CostTable, source: str):
        self.prior, self.source = prior, source
        self.observations = 0
        # kind -> level estimates: the kind as a whole, each width, each cell; for ms and joules
        self._levels: dict[tuple, RobustEstimate] = {}
        self._plain_shapes: dict[tuple[str, int], float] = {}  # _plain_shape's, until plain decode's levels move
        self._plain_widths: dict[str, list[int]] = {"ms": [], "j": []}  # widths plain decode was measured at, sorted
        self._table: CostTable | None = None
        self._estimates: CostTable | None = None
        self._optimistic: CostTable | None = None
        self._unpriced = 0  # observations since the tables were built
        self._prior_cells: dict[tuple[Kind, int, int], Cost] = {}  # the prior never changes: read once
        self.tempo = {"ms": 0.0, "j": 0.0}  # log of the machine's speed now against the cells' average
        self._held: deque[_Held] = deque()  # speculative steps waiting for the plain steps after them
        self._after = _no_residuals()  # plain residuals since the latest held step, per unit
        self._clock = 0  # plain steps observed, all told: speculative evidence ages by it
        self._run = 0  # speculative steps since the latest plain step: the place of the next in its spell

    def observe(self, kind: Kind, width: int, depth: int, ms: float, joules: float) -> None:
        """One served step's cost (a plain step is verify at depth 0)."""
        if width < 1 or depth < 0 or not (ms > 0 and math.isfinite(ms)):
            return
        prior = self._prior_cost(kind, width, depth)
        logs = {unit: math.log(value / base) for unit, value, base in (("ms", ms, prior.ms), ("j", joules, prior.joules))
                if value > 0 and base > 0 and math.isfinite(value)}
        self.observations += 1
        if not _plain(kind, depth):  # learned relative to plain decode at its time, once the steps after it show it
            self._held.append(_Held(kind, width, depth, logs, dict(self.tempo), self._run))
            self._run += 1
            self._after = _no_residuals()
            if len(self._held) > HOLD_MAX:
                held = self._held.popleft()
                if held.place < SPELL_HEAD:
                    self._learn(held, held.tempo)
            return
        self._run = 0
        for unit, x in logs.items():  # the reference: it sets the tempo, and its cells learn what remains
            if width not in self._plain_widths[unit]:
                bisect.insort(self._plain_widths[unit], width)
            residual = x - self._plain_shape(unit, width)
            self._follow_tempo(unit, residual)
            if self._held:
                self._after[unit].append(residual)
            for key in _levels_of(kind, unit, width, depth):
                self._levels.setdefault(key, RobustEstimate()).update(x - self.tempo[unit])
            self._plain_shapes.clear()  # plain decode's levels moved
        self._moved()
        self._clock += 1
        if self._held and len(self._after["ms"]) >= HOLD_PLAIN:
            self.flush()

    def flush(self) -> None:
        """Learn every held speculative step, each at a tempo between its own step's and the machine's
        speed after its spell (the next spell's tempo; after the last, the median of the plain steps
        since, or the tempo now where there are none), by its place in the spell: the change, if any,
        came somewhere inside it. A median, since one of those few steps is often a request's first
        or last, a transition that says nothing of the machine's speed."""
        after = {unit: statistics.median(r) if r else self.tempo[unit] for unit, r in self._after.items()}
        spells = _spells(list(self._held))
        self._held.clear()
        for i, spell in enumerate(spells):
            bracket = spells[i + 1][0].tempo if i + 1 < len(spells) else after
            length = spell[-1].place + 1
            for held in spell:
                w = (held.place + 1) / (length + 1)
                self._learn(held, {unit: t + w * (bracket[unit] - t) for unit, t in held.tempo.items()})
        self._after = _no_residuals()

    def _learn(self, held: "_Held", tempo: dict) -> None:
        for unit, x in held.logs.items():
            x -= self._plain_shape(unit, held.width) + tempo[unit]
            for key in _levels_of(held.kind, unit, held.width, held.depth):
                level = self._aged(self._levels.setdefault(key, RobustEstimate()))
                level.update(x)
                level.seen = self._clock
        self._moved()

    def _aged(self, level: RobustEstimate) -> RobustEstimate:
        """A speculative level with its count halved for each AGE_STEPS plain steps since its latest observation."""
        halvings = (self._clock - level.seen) // AGE_STEPS
        if halvings and level.count > AGED_FLOOR:
            level.count = max(AGED_FLOOR, level.count >> min(halvings, 30))
            level.seen = self._clock - (self._clock - level.seen) % AGE_STEPS
        return level

    def _moved(self) -> None:
        self._unpriced += 1
        if self._unpriced >= REBUILD_EVERY or self.observations <= REBUILD_EVERY:  # the first ones move cells most
            self._table = self._optimistic = self._estimates = None

    def plain_measured(self) -> bool:
        """Whether plain decode, the reference of every speculative cell, has been measured here."""
        plain = self._levels.get(("plain", "ms"))
        return plain is not None and plain.count >= PLAIN_FIRST

    def _follow_tempo(self, unit: str, residual: float) -> None:
        """Move the tempo toward what the plain cell's estimate does not explain (clipped)."""
        tempo = self.tempo[unit]
        self.tempo[unit] = tempo + min(TEMPO_CLIP, max(-TEMPO_CLIP, residual - tempo)) / TEMPO_MEMORY

    def ratio(self, kind: Kind, unit: str, width: int, depth: int) -> float:
        """Measured over prior cost at this cell, at the machine's speed now (1.0 before anything is measured)."""
        if _plain(kind, depth):
            return math.exp(self._plain_shift(unit, width))
        return math.exp(self._plain_shift(unit, width) + self._shape(kind, unit, width, depth))

    def _plain_shift(self, unit: str, width: int) -> float:
        """Log of plain decode's measured over prior cost at this width, now."""
        return self._plain_shape(unit, width) + self.tempo[unit]

    def _plain_shape(self, unit: str, width: int) -> float:
        shape = self._plain_shapes.get((unit, width))
        if shape is None:  # read by every cell of a table's rebuild; plain steps alone move it
            shape = shrunk(self._levels.get(("verify", unit, width, 0)), self._plain_between(unit, width))
            self._plain_shapes[(unit, width)] = shape
        return shape

    def _plain_between(self, unit: str, width: int) -> float:
        """What a width's plain shape leans on before its own steps: interpolated (in log width)
        between the nearest widths measured on either side, else the nearest one's, else all widths'.
        The prior's shape across widths is another machine's: leaning on the mean over all widths,
        a 2-core AMD EPYC read its width-2 plain step at 41 ms from a Xeon's shape where width 1 took
        28 and width 3 36, so a ragged batch's width-2 drafts looked cheap against it."""
        top = shrunk(self._levels.get(("plain", unit)), 0.0)
        others = [w for w in self._plain_widths[unit] if w != width]
        i = bisect.bisect_left(others, width)
        below, above = (others[i - 1] if i else None), (others[i] if i < len(others) else None)
        own = lambda w: shrunk(self._levels[("verify", unit, w, 0)], top)  # noqa: E731
        if below is not None and above is not None:
            t = math.log(width / below) / math.log(above / below)
            return own(below) + t * (own(above) - own(below))
        if below is not None or above is not None:
            return own(below if below is not None else above)
        return top

    def _shape(self, kind: Kind, unit: str, width: int, depth: int) -> float:
        """A speculative cell's log-ratio to the prior beyond plain decode's: what its steps teach."""
        top = shrunk(self._levels.get((kind, unit)), 0.0)
        mid = shrunk(self._levels.get((kind, unit, width)), top)
        return shrunk(self._levels.get((kind, unit, width, depth)), mid)

    def cost(self, kind: Kind, width: int, depth: int) -> Cost:
        """A cell's cost at the machine's speed now."""
        prior = self._prior_cost(kind, width, depth)
        return Cost(ms=prior.ms * self.ratio(kind, "ms", width, depth),
                    joules=prior.joules * self.ratio(kind, "j", width, depth))

    def estimates(self) -> CostTable:
        """The corrected table: the prior's grid plus every width served, each cell at its estimate."""
        if self._estimates is None:
            self._unpriced = 0
            widths = sorted(set(self.prior.widths) | {k[2] for k in self._levels if len(k) >= 3})
            grid = {kind: tuple(tuple(self._cell(kind, n, k) for k in self.prior.depths) for n in widths)
                    for kind in ("verify", "draft")}
            self._estimates = msgspec.structs.replace(self.prior, widths=tuple(widths), verify=grid["verify"],
                                                      draft=grid["draft"])
        return self._estimates

    def table(self) -> CostTable:
        """The table the planner reads: the estimates, each speculative cell at an upper bound of its
        cost (CAUTION_Z) where the prior is not this machine's own measurement."""
        if self._table is None:
            self._table = self._bounded(CAUTION_Z) if self.source not in OWN_PRIORS else self.estimates()
        return self._table

    def optimistic_table(self) -> CostTable:
        """The table with each speculative cell at the lower bound of its cost (Z spreads over the root
        of its own count + 1): what exploration reads, so a cell the prior's shape prices too dear
        still gets measured, and stops being discounted once it has been. Plain decode (verify at
        depth 0), the baseline every step is judged against, keeps its estimate."""
        if self._optimistic is None:
            self._optimistic = self._bounded(-Z)
        return self._optimistic

    def _bounded(self, z: float) -> CostTable:
        """The estimates with each speculative cell moved by z spreads over the root of its own count + 1."""
        table = self.estimates()
        grid = {kind: tuple(tuple(self._bound(kind, n, k, c, z) for k, c in zip(table.depths, cells))
                            for n, cells in zip(table.widths, getattr(table, kind)))
                for kind in ("verify", "draft")}
        return msgspec.structs.replace(table, verify=grid["verify"], draft=grid["draft"])

    def _bound(self, kind: Kind, n: int, k: int, cost: Cost, z: float) -> Cost:
        """Exploration (z < 0) reads the cell's aged count, so evidence gone stale is looked at again;
        caution (z > 0) its observations ever: with the aged count, a cell measured hundreds of times
        was read 3.5% dearer than its estimate after a long plain run (25% step noise), which only
        kept it from being used again."""
        if k == 0:
            return cost
        own = self._levels.get((kind, "ms", n, k))
        own = self._aged(own) if own else None
        count = (own.count if z < 0 else own.measured) if own else 0
        spread = max(own.spread, SPREAD_FLOOR) if own else SPREAD_START
        factor = math.exp(z * spread / math.sqrt(count + 1))
        return Cost(ms=cost.ms * factor, joules=cost.joules * factor)

    def learned_table(self, meta: TableMeta) -> CostTable:
        """The corrected table under new metadata, with every observation in: what is saved for the next start."""
        self.flush()
        self._table = self._optimistic = self._estimates = None
        return msgspec.structs.replace(self.estimates(), meta=meta)

    def _cell(self, kind: Kind, n: int, k: int) -> Cost:
        if kind == "draft" and k == 0:
            return Cost(ms=0.0, joules=0.0)  # depth 0 drafts nothing
        return self.cost(kind, n, k)

    def _prior_cost(self, kind: Kind, width: int, depth: int) -> Cost:
        key = (kind, width, depth)
        if key not in self._prior_cells:  # interpolating a cell reads the whole width row: once each
            self._prior_cells[key] = (self.prior.verify_cost if kind == "verify" else self.prior.draft_cost)(width, depth)
        return self._prior_cells[key]

    def cells(self) -> list[dict]:
        """Every measured cell with its count, spread (log units) and current ms, for /health."""
        out = []
        for key, est in sorted(self._levels.items(), key=lambda kv: str(kv[0])):
            if len(key) == 4 and key[1] == "ms":
                kind, _, width, depth = key
                out.append({"kind": kind, "width": width, "depth": depth, "count": est.count,
                            "spread": round(est.spread, 4), "ms": round(self.cost(kind, width, depth).ms, 3),
                            "ratio_to_prior": round(self.ratio(kind, "ms", width, depth), 4)})
        return out

    def snapshot(self) -> dict:
        top = self._levels.get(("plain", "ms"))
        return {"prior_source": self.source, "prior_machine": self.prior.meta.machine,
                "observations": self.observations,
                "scale_to_prior": round(math.exp(top.centre), 4) if top and top.count else None,
                "tempo": round(math.exp(self.tempo["ms"]), 4), "held_steps": len(self._held),
                "cells": self.cells()}


class _Held(NamedTuple):
    """A speculative step's log cost over its prior cell (per unit) and the tempo at its step."""

    kind: Kind
    width: int
    depth: int
    logs: dict
    tempo: dict
    place: int  # its index in its spell


def _spells(held: list[_Held]) -> list[list[_Held]]:
    """Held steps split into spells (each starts at place 0, or is what remains of one)."""
    spells: list[list[_Held]] = []
    for step in held:
        if step.place == 0 or not spells:
            spells.append([])
        spells[-1].append(step)
    return spells


def _no_residuals() -> dict[str, list[float]]:
    return {"ms": [], "j": []}


def _plain(kind: Kind, depth: int) -> bool:
    return kind == "verify" and depth == 0


def _levels_of(kind: Kind, unit: str, width: int, depth: int) -> tuple[tuple, ...]:
    """The estimates one observation updates: plain decode's over all widths and at its width; a
    speculative kind's over all cells, at its width and its own cell."""
    if _plain(kind, depth):
        return ("plain", unit), ("verify", unit, width, 0)
    return (kind, unit), (kind, unit, width), (kind, unit, width, depth)
