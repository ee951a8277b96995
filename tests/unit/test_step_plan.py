"""plan_step and the batch planner: one verify depth for the batch, chosen over all its sequences."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.batch_plan import batch_depths
from runtime.cost_table import Cost, make_table
from runtime.plan import expected_tokens, prior_at, propose_depth
from runtime.step_plan import Plan, SeqView, plan_step
from tests.unit.test_online_estimators import META
from tests.unit.test_plan import planner_cases

OBJECTIVES = ("balanced", "latency", "energy")
rates = st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).map(tuple)


def rows_of(draw, objectives=OBJECTIVES):
    """A batch: (objective, acceptance) rows, some not eligible (None)."""
    size = draw(st.integers(1, 6))
    return [None if draw(st.integers(0, 5)) == 0 else (draw(st.sampled_from(objectives)), draw(rates))
            for _ in range(size)]


def speed(table, rows, depths) -> tuple[float, float]:
    """The eligible sequences' tokens per ms under these depths, and plain decode's."""
    n, deepest = len(rows), max(depths)
    drafting = sum(1 for d in depths if d)
    ms = table.verify_cost(n, deepest).ms + (table.draft_cost(drafting, deepest).ms if drafting else 0.0)
    # past its last rate a row's acceptance is its last rate's, as the planner reads it (prior_at)
    tokens = sum(expected_tokens([prior_at(r[1], t) for t in range(1, d + 1)]) for r, d in zip(rows, depths) if r)
    return tokens / ms, sum(1 for r in rows if r) / table.step_cost(n, 0).ms


@settings(max_examples=400, deadline=None)
@given(case=planner_cases(), view=st.tuples(st.sampled_from(OBJECTIVES), rates), n=st.integers(1, 6),
       slack=st.floats(0.0, 1.0), max_k=st.integers(1, 4))
def test_a_batch_of_alike_sequences_scores_as_propose_depth_plans_it(case, view, n, slack, max_k):
    # Alike rows whose drafts cost the same at any width: the batch's plan is propose_depth's, up to
    # ties (rows adding nothing for free may be left out).
    table, _ = case
    depths = batch_depths([view] * n, table, max_k=max_k, slack=slack)
    assert len({d for d in depths if d}) <= 1
    alone = propose_depth(n, table=table, prior=view[1], max_k=max_k, slack=slack, mtp_max_seqs=32,
                          objective=view[0])
    assert math.isclose(_score(table, view, depths), _score(table, view, (alone.depth,) * n), rel_tol=1e-9)


def _score(table, view, depths):
    n, deepest = len(depths), max(depths)
    cost = table.verify_cost(n, deepest) + table.draft_cost(n, deepest)  # width-free drafts: m rows cost n's
    tokens = sum(expected_tokens(view[1][:d]) for d in depths)
    per_ms, per_j = tokens / cost.ms, tokens / cost.joules
    return {"latency": per_ms, "energy": per_j, "balanced": math.sqrt(per_ms * per_j)}[view[0]]


@settings(max_examples=400, deadline=None)
@given(data=st.data(), case=planner_cases(), slack=st.floats(0.0, 1.0), max_k=st.integers(1, 4))
def test_every_drafting_row_drafts_one_depth_and_balanced_is_never_slower(data, case, slack, max_k):
    # The verifier pads every row to the deepest: a shallower drafting row would buy nothing.
    table, _ = case
    rows = rows_of(data.draw, objectives=("balanced",))
    depths = batch_depths(rows, table, max_k=max_k, slack=slack)
    assert len({d for d in depths if d}) <= 1
    assert all(d == 0 for r, d in zip(rows, depths) if r is None)
    if any(depths):
        made, plain = speed(table, rows, depths)
        assert made >= plain * (1 - 1e-9)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), case=planner_cases(), lift=rates, objective=st.sampled_from(("balanced", "latency")),
       max_k=st.integers(1, 4))
def test_a_batch_that_drafts_keeps_drafting_at_higher_acceptance(data, case, lift, objective, max_k):
    table, _ = case
    rows = [(objective, r[1]) if r else None for r in rows_of(data.draw)]
    higher = [(o, tuple(min(1.0, a + b) for a, b in zip(r, lift))) if o else None
              for o, r in (row or (None, None) for row in rows)]
    if any(batch_depths(rows, table, max_k=max_k, slack=0.1)):
        assert any(batch_depths(higher, table, max_k=max_k, slack=0.1))


def width4_table():
    """A 2-core Xeon's width-4 cells, as its served controller learned them (ms; joules alike)."""
    verify = {0: 50.6, 1: 62.1, 2: 74.5}
    draft = lambda n, k: 0.0 if k == 0 else (1.7 if n == 1 else 8.0) * k  # noqa: E731
    return make_table(meta=META, widths=(1, 4), depths=(0, 1, 2),
                      verify=lambda n, k: Cost(ms=verify[k], joules=verify[k] / 50),
                      draft=lambda n, k: Cost(ms=draft(n, k), joules=draft(n, k) / 50))


def test_one_hopeful_row_does_not_pay_a_whole_verify_for_the_batch():
    """Planned alone, the row at 0.55 drafted and the batch paid a depth-1 verify for half a token
    (64 ms against 51 ms plain): its depth is the batch's, so the batch drafts together or not at all."""
    means = (0.36, 0.41, 0.47, 0.55)
    for objective in OBJECTIVES:
        depths = batch_depths([(objective, (p, p)) for p in means], width4_table(), max_k=2, slack=0.1)
        assert depths in ((0, 0, 0, 0), (1, 1, 1, 1))
    fast = batch_depths([("latency", (p, p)) for p in means], width4_table(), max_k=2, slack=0.1)
    assert fast == (1, 1, 1, 1)  # 5.8 tokens in 70 ms beat 4 in 51


def test_a_row_that_adds_too_little_for_its_draft_stays_plain():
    means = (0.9, 0.9, 0.9, 0.0)
    depths = batch_depths([("latency", (p,)) for p in means], width4_table(), max_k=2, slack=0.1)
    assert depths[3] == 0 and depths[0] > 0


def test_over_the_cap_the_batch_decodes_plainly():
    view = SeqView("latency", (0.9,), (0.9,))
    plan = plan_step([view] * 3, width4_table(), max_k=2, slack=0.1, mtp_max_seqs=2, explore=True,
                     allowance_ms=1e6)
    assert plan == Plan((0, 0, 0))
