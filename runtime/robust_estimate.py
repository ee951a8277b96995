"""A robust online estimate of a stream of log-ratios: what every cell of the online cost model
(runtime/online_cost.py) and the tree planner's verify costs (runtime/tree_plan.py) keep.

A centre, a spread (mean absolute residual) and a count. A residual is clipped to CLIP spreads
before it moves the centre, so one outlier (a GC pause, a page fault) moves an estimate by at most
CLIP * spread / (count + 1) and never far. Past MEMORY observations the centre becomes an
exponential average, so an estimate follows a machine whose speed drifts. An estimate with little
evidence leans on its parent's (`shrunk`).
"""

from __future__ import annotations

import msgspec

CLIP = 3.0  # residuals past 3 spreads are clipped: a stall cannot drag a cell
MEMORY = 64  # observations after which a centre is an exponential average over about this many
SPREAD_FLOOR = 0.02  # log units (2%): a tight cell still lets a real change through, step by step
SPREAD_START = 0.25  # the spread assumed before any residual is seen
SHRINK = 8.0  # pseudo-observations of a level's parent: a cell leans on its width until it has ~8 own


class RobustEstimate(msgspec.Struct, kw_only=True):
    """A clipped running mean of log-ratios, its spread and its count."""

    centre: float = 0.0
    spread: float = SPREAD_START
    count: int = 0  # weight of its evidence (a speculative level's halves as it ages)
    seen: int = 0  # the plain-step clock at its latest observation (a speculative level's evidence ages)
    measured: int = 0  # observations ever: what caution reads (ageing asks for a new look, not for doubt)

    def update(self, x: float) -> None:
        if self.count == 0:
            self.centre, self.count = x, 1
            self.measured += 1
            return
        bound = CLIP * max(self.spread, SPREAD_FLOOR)
        residual = min(bound, max(-bound, x - self.centre))
        weight = 1.0 / min(self.count + 1, MEMORY)
        self.centre += weight * residual
        self.spread += weight * (abs(residual) - self.spread)
        self.count += 1
        self.measured += 1


def shrunk(own: RobustEstimate | None, parent: float) -> float:
    """own's centre, pulled toward the parent's by SHRINK pseudo-observations."""
    if own is None or own.count == 0:
        return parent
    return (own.count * own.centre + SHRINK * parent) / (own.count + SHRINK)
