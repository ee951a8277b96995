"""plan_step's batch bound: planning a batch from its highest acceptance first changes no plan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.plan import expected_tokens, propose_depth
from runtime.step_plan import EXPLORE_BURST, Plan, SeqView, expected_loss, highest, plan_step, shallowest_paying
from tests.unit.test_plan import planner_cases, table_of

OBJECTIVES = ("balanced", "latency", "energy")
rates = st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).map(tuple)


@st.composite
def views(draw):
    if draw(st.integers(0, 5)) == 0:
        return None  # not eligible: a plain row
    mean = draw(rates)
    lift = draw(rates)
    upper = tuple(min(1.0, m + l) for m, l in zip(mean, lift))
    return SeqView(draw(st.sampled_from(OBJECTIVES)), mean, upper)


def every_row_plan(views, table, *, max_k, slack, mtp_max_seqs, explore, allowance_ms, continuing, optimistic):
    """The plan with every row planned on its own (plan_step before its batch bound)."""
    n = len(views)

    def depth(view, upper, most=max_k):
        if view is None:
            return 0
        return propose_depth(n, table=optimistic if upper else table, prior=view.upper if upper else view.mean,
                             max_k=most, slack=slack, mtp_max_seqs=mtp_max_seqs, objective=view.objective).depth

    depths = tuple(depth(v, False) for v in views)
    if any(depths) or not explore or allowance_ms is None:
        return Plan(depths)
    upper = tuple(shallowest_paying(lambda most: depth(v, True, most), max_k) for v in views)
    needed = 0.0 if continuing else EXPLORE_BURST * expected_loss(table, views, upper)
    if any(upper) and allowance_ms >= needed and (allowance_ms > 0 or not continuing):
        return Plan(upper, exploring=True)
    return Plan(depths)


@settings(max_examples=400, deadline=None)
@given(case=planner_cases(), cheaper=planner_cases(), batch=st.lists(views(), min_size=1, max_size=6),
       slack=st.floats(0.0, 1.0), max_k=st.integers(1, 3), explore=st.booleans(),
       allowance=st.one_of(st.none(), st.floats(0.0, 50.0)), continuing=st.booleans())
def test_the_batch_bound_changes_no_plan(case, cheaper, batch, slack, max_k, explore, allowance, continuing):
    table, optimistic = case[0], cheaper[0]
    kw = dict(max_k=max_k, slack=slack, mtp_max_seqs=32, explore=explore, allowance_ms=allowance,
              continuing=continuing, optimistic=optimistic)
    assert plan_step(batch, table, **kw) == every_row_plan(batch, table, **kw)


@settings(max_examples=400, deadline=None)
@given(case=planner_cases(), low=rates, lift=rates, objective=st.sampled_from(OBJECTIVES),
       slack=st.floats(0.0, 1.0), max_k=st.integers(1, 4), n=st.integers(1, 8))
def test_a_depth_that_pays_keeps_paying_at_higher_acceptance(case, low, lift, objective, slack, max_k, n):
    # What the bound rests on: drafting at all is monotone in the acceptance at every position.
    table, _ = case
    high = tuple(min(1.0, a + b) for a, b in zip(low, lift))
    choose = lambda prior: propose_depth(n, table=table, prior=prior, max_k=max_k, slack=slack,  # noqa: E731
                                         mtp_max_seqs=32, objective=objective).depth
    assert choose(low) == 0 or choose(high) > 0


def test_the_highest_view_is_per_objective_and_position():
    a, b = SeqView("balanced", (0.2, 0.5), (0.3, 0.6)), SeqView("balanced", (0.4, 0.1), (0.5, 0.2))
    c = SeqView("energy", (0.9,), (1.0,))
    tops = {v.objective: v for v in highest([a, None, b, c], upper=False)}
    assert tops["balanced"].mean == (0.4, 0.5) and tops["energy"].mean == (0.9,)
    assert highest([a, b], upper=True)[0].mean == (0.5, 0.6)
    # A shorter tuple's last value stands for the positions past its end, as the planner reads it.
    assert highest([SeqView("latency", (0.7,), (0.7,)), SeqView("latency", (0.1, 0.2), (0.1, 0.2))],
                   upper=False)[0].mean == (0.7, 0.7)


def test_a_wide_batch_that_cannot_pay_is_planned_without_a_call_per_row(monkeypatch):
    import runtime.step_plan as step_plan

    calls = []
    real = step_plan.propose_depth
    monkeypatch.setattr(step_plan, "propose_depth", lambda *a, **k: calls.append(1) or real(*a, **k))
    table = table_of((10.0, 30.0, 40.0, 50.0, 60.0))  # a draft costs 3x a plain step: nothing pays
    batch = [SeqView("balanced", (0.3, 0.2, 0.1), (0.5, 0.4, 0.3)) for _ in range(16)]
    plan = plan_step(batch, table, max_k=3, slack=0.1, mtp_max_seqs=32, explore=True, allowance_ms=100.0,
                     optimistic=table)
    assert plan == Plan((0,) * 16) and len(calls) <= 4  # 1 for the means, up to 3 for the bounds
    assert expected_tokens(()) == 1.0
