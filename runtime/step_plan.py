"""One step's plan from what the controller read: each sequence's draft depth, and exploration.

Pure maths over SeqViews (objective, acceptance mean and upper bound) and a cost table; the depths
are planned over the whole batch (runtime/batch_plan.py). The served path (runtime/controller.py)
and `metrale replay` (runtime/replay.py) both run plan_step, so a trace's decision can be re-made
from what it recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.batch_plan import batch_depths, plan_cost
from runtime.plan import expected_tokens

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
    # What exploration is charged against, in ms per token a sequence emits: the mean plan's expected
    # cost where it speculates already (exploring deeper), else None (plain decode's).
    baseline_ms_per_token: float | None = None

    @property
    def speculates(self) -> bool:
        return any(self.depths)


@dataclass(frozen=True)
class SeqView:
    objective: str
    mean: tuple[float, ...]  # P(accept) at draft positions 1..max_k
    upper: tuple[float, ...]  # its upper bounds


def plan_step(views: list[SeqView | None], table, *, max_k: int, slack: float, mtp_max_seqs: int,
              explore: bool, allowance_ms: float | None, continuing: bool = False, optimistic=None,
              depths_of=batch_depths) -> Plan:
    """Each sequence's depth (None: not eligible, a plain row), planned over the batch by each
    sequence's objective (runtime/batch_plan.py); where none pays, the depths the upper bounds choose
    (acceptance at its upper bound, costs at their lower bound: the `optimistic` table) if the
    allowance covers the expected loss (None: no exploration) for a whole burst (EXPLORE_BURST
    steps), or while a burst goes on (continuing) and the allowance is not spent. The one
    implementation the served path and `metrale replay` both run; depths_of is batch_depths or the
    same answers remembered (runtime/plan_memo.py)."""
    n = len(views)
    if n > mtp_max_seqs:  # the scheduler plain-decodes above the cap
        return Plan((0,) * n)
    depths = depths_of([(v.objective, v.mean) if v else None for v in views], table, max_k=max_k, slack=slack)
    if not explore or allowance_ms is None:
        return Plan(depths)
    bounds = [(v.objective, v.upper) if v else None for v in views]
    plan_bounds = lambda most: depths_of(bounds, optimistic or table, max_k=most, slack=slack)  # noqa: E731
    if any(depths):
        return _deeper(views, depths, plan_bounds(max_k), table, allowance_ms, continuing)
    upper = shallowest_paying(plan_bounds, max_k, n)
    if not any(upper):
        return Plan(depths)
    if _affordable(allowance_ms, continuing, lambda: expected_loss(table, views, upper)):
        return Plan(upper, exploring=True)
    return Plan(depths)


def _affordable(allowance_ms: float, continuing: bool, step_loss) -> bool:
    """Whether the allowance covers a new burst's expected loss (step_loss() a step), or lets a
    burst under way go on while it is not spent."""
    needed = 0.0 if continuing else EXPLORE_BURST * step_loss()
    return allowance_ms >= needed and (allowance_ms > 0 or not continuing)


def _deeper(views, depths: tuple[int, ...], upper: tuple[int, ...], table, allowance_ms: float,
            continuing: bool) -> Plan:
    """Where the mean plan drafts and the bounds would draft deeper for some sequence, those go one
    deeper (the shallowest experiment up), charged against the mean plan's expected ms per token.
    Without it a depth the prior priced dear was never measured while a shallower one paid: on a
    2-core AMD EPYC code stayed at depth 1 (1.31x) where depth 3 paid 1.40x."""
    probe = tuple(d + 1 if u > d and d else d for d, u in zip(depths, upper))
    if probe == depths:
        return Plan(depths)
    baseline = ms_per_token(table, views, depths)
    if _affordable(allowance_ms, continuing, lambda: expected_loss(table, views, probe, baseline)):
        return Plan(probe, exploring=True, baseline_ms_per_token=baseline)
    return Plan(depths)


def shallowest_paying(plan_within, max_k: int, n: int) -> tuple[int, ...]:
    """The depths the upper bounds choose within the shallowest cap at which they draft at all (all 0:
    none). Exploring shallow first: the cheapest experiment, and the cell a mean plan flips on
    first. Exploring the bounds' deepest choice measured only that cell, and the shallower ones
    took its cost by their parents' correction: on a 2-core AMD EPYC, where a depth-2 verify costs
    1.5x a plain step and depth 1 1.15x, depth 1 read 1.44x from 5 own steps and code stayed plain."""
    for most in range(1, max_k + 1):
        if any(found := plan_within(most)):
            return found
    return (0,) * n


def expected_loss(table, views: list[SeqView | None], depths: tuple[int, ...],
                  baseline_ms_per_token: float | None = None) -> float:
    """ms a step at these depths is expected to lose against plain decode (or against a baseline of
    ms per token a sequence emits), at the mean acceptance (a plain row emits one token:
    expected_tokens of no drafts). The step verifies every row to the deepest depth and drafts for
    the rows that draft."""
    tokens, ms = _expected(table, views, depths)
    baseline = table.step_cost(len(views), 0).ms if baseline_ms_per_token is None else baseline_ms_per_token
    return max(0.0, ms - baseline * tokens / len(views))


def ms_per_token(table, views: list[SeqView | None], depths: tuple[int, ...]) -> float:
    """A step's expected ms per token a sequence emits at these depths, at the mean acceptance."""
    tokens, ms = _expected(table, views, depths)
    return ms * len(views) / tokens


def _expected(table, views: list[SeqView | None], depths: tuple[int, ...]) -> tuple[float, float]:
    """(tokens the step emits, its ms) at these depths, at the mean acceptance."""
    n, deepest, drafting = len(views), max(depths), sum(1 for d in depths if d)
    tokens = sum(expected_tokens(v.mean[:d] if v else ()) for v, d in zip(views, depths))
    verify, draft = plan_cost(table, n, deepest, drafting)
    return tokens, verify.ms + draft.ms
