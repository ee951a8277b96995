"""One step's plan from what the controller read: each sequence's draft depth, and exploration.

Pure maths over SeqViews (objective, acceptance mean and upper bound) and a cost table. The served
path (runtime/controller.py) and `metrale replay` (runtime/replay.py) both run plan_step, so a
trace's decision can be re-made from what it recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.plan import expected_tokens, prior_at, propose_depth

# An exploration runs this many steps: the cold plain step after it is shared by them. A burst starts
# only where the allowance covers all of it at the expected loss: started on one step's worth, a
# burst at width 4 (~45 ms lost a step on a 2-core AMD EPYC) overdrew a 1% allowance by three steps,
# and over a bench's 16 s of plain decode exploration cost 3% of it.
EXPLORE_BURST = 4


@dataclass(frozen=True)
class Plan:
    """One step: each sequence's draft depth (0: a plain row), and whether it explores."""

    depths: tuple[int, ...]
    exploring: bool = False

    @property
    def speculates(self) -> bool:
        return any(self.depths)


@dataclass(frozen=True)
class SeqView:
    objective: str
    mean: tuple[float, ...]  # P(accept) at draft positions 1..max_k
    upper: tuple[float, ...]  # its upper bounds


def plan_step(views: list[SeqView | None], table, *, max_k: int, slack: float, mtp_max_seqs: int,
              explore: bool, allowance_ms: float | None, continuing: bool = False, optimistic=None) -> Plan:
    """Each sequence's depth (None: not eligible, a plain row) by its objective at the batch's width;
    where none pays, the depths the upper bounds choose (acceptance at its upper bound, costs at their
    lower bound: the `optimistic` table) if the allowance covers the expected loss (None: no
    exploration) for a whole burst (EXPLORE_BURST steps), or while a burst goes on (continuing) and the
    allowance is not spent. The one implementation the served path and `metrale replay` both run."""
    n = len(views)

    def depth(view: SeqView | None, upper: bool, most: int = max_k) -> int:
        if view is None:
            return 0
        return propose_depth(n, table=(optimistic or table) if upper else table,
                             prior=view.upper if upper else view.mean, max_k=most, slack=slack,
                             mtp_max_seqs=mtp_max_seqs, objective=view.objective).depth

    def exploring_depth(view: SeqView | None) -> int:
        return shallowest_paying(lambda most: depth(view, True, most), max_k)

    # A depth pays only at acceptance at least some sequence's: where the batch's highest drafts at
    # no depth, none does, and a wide batch that cannot pay is planned in a few calls, not 5 a row.
    none_pays = not any(depth(v, False) for v in highest(views, upper=False))
    depths = (0,) * n if none_pays else tuple(depth(v, False) for v in views)
    if any(depths) or not explore or allowance_ms is None:
        return Plan(depths)
    if not any(exploring_depth(v) for v in highest(views, upper=True)):
        return Plan(depths)
    upper = tuple(exploring_depth(v) for v in views)
    needed = 0.0 if continuing else EXPLORE_BURST * expected_loss(table, views, upper)
    if any(upper) and allowance_ms >= needed and (allowance_ms > 0 or not continuing):
        return Plan(upper, exploring=True)
    return Plan(depths)


def highest(views: list[SeqView | None], upper: bool) -> list[SeqView]:
    """Per objective, the highest acceptance (or upper bound) any of these sequences has at each draft
    position: the planner's tokens grow with acceptance at every position, so where this one drafts
    at no depth, none of them does."""
    top: dict[str, tuple[float, ...]] = {}
    for view in views:
        if view is not None:
            rates = view.upper if upper else view.mean
            seen = top.get(view.objective)
            top[view.objective] = rates if seen is None else _elementwise_max(seen, rates)
    return [SeqView(objective, rates, rates) for objective, rates in top.items()]


def _elementwise_max(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    # Positions past a tuple's end read as the planner reads them (prior_at: its last value).
    return tuple(max(prior_at(a, t), prior_at(b, t)) for t in range(1, max(len(a), len(b)) + 1))


def shallowest_paying(depth_within, max_k: int) -> int:
    """The depth the upper bounds choose within the shallowest cap at which they draft at all (0:
    none). Exploring shallow first: the cheapest experiment, and the cell a mean plan flips on
    first. Exploring the bounds' deepest choice measured only that cell, and the shallower ones
    took its cost by their parents' correction: on a 2-core AMD EPYC, where a depth-2 verify costs
    1.5x a plain step and depth 1 1.15x, depth 1 read 1.44x from 5 own steps and code stayed plain."""
    for most in range(1, max_k + 1):
        if (found := depth_within(most)) > 0:
            return found
    return 0


def expected_loss(table, views: list[SeqView | None], depths: tuple[int, ...]) -> float:
    """ms a step at these depths is expected to lose against plain decode, at the mean acceptance
    (a plain row emits one token: expected_tokens of no drafts)."""
    n = len(views)
    tokens = sum(expected_tokens(v.mean[:d] if v else ()) for v, d in zip(views, depths))
    plain = table.step_cost(n, 0).ms
    return max(0.0, table.step_cost(n, max(depths)).ms - plain * tokens / n)
