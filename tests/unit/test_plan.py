"""The measured planner (spec/plan.md): propose_depth and sequence_depths, one invariant a test."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.cost_table import AcceptanceCalibration, Cost, TableMeta, make_table
from runtime.plan import DepthChoice, expected_tokens, propose_depth, sequence_depths

META = TableMeta(
    model_id="m", drafter="d", machine="x", dtype="float32", blas="openblas",
    energy_source="cpu_proxy", watts_per_core=10.0, date="2026-11-29T00:00:00+00:00",
)
FREE = (0.0,) * 5


def table_of(verify, draft=FREE, *, joules=None, widths=(1,), depths=(0, 1, 2, 3, 4)):
    """Per-depth verify ms (joules = ms unless given) and draft ms; the same at every width."""
    joules = verify if joules is None else joules
    return make_table(
        meta=META, widths=widths, depths=depths,
        verify=lambda n, k: Cost(ms=verify[depths.index(k)], joules=joules[depths.index(k)]),
        draft=lambda n, k: Cost(ms=draft[depths.index(k)], joules=draft[depths.index(k)]),
    )


class UntouchableTable:
    def __getattr__(self, name):
        raise AssertionError(f"the table was consulted ({name})")


def propose(table, n=1, prior=(0.9,), max_k=4, slack=0.1, cap=32) -> DepthChoice:
    return propose_depth(n, table=table, prior=prior, max_k=max_k, slack=slack, mtp_max_seqs=cap)


def logp(*probs):
    return [math.log(p) for p in probs]


# ---- propose_depth -------------------------------------------------------------------------


def test_expected_tokens_is_one_plus_the_chained_acceptances():
    assert expected_tokens([]) == 1.0
    assert expected_tokens([0.5, 0.5, 1.0]) == pytest.approx(1 + 0.5 + 0.25 + 0.25)


def test_drafting_deep_when_verify_is_cheap():
    choice = propose(table_of((10.0, 11.0, 12.0, 13.0, 14.0)))
    assert choice == DepthChoice(
        depth=4, reason="cost_model",
        tokens_per_ms=expected_tokens([0.9] * 4) / 14.0,
        tokens_per_joule=expected_tokens([0.9] * 4) / 14.0,
    )


def test_no_drafting_when_it_is_neither_faster_nor_cheaper():
    # The reference BLAS: verifying K drafts costs (K + 1) plain steps.
    choice = propose(table_of((10.0, 20.0, 30.0, 40.0, 50.0)), prior=(0.9,))
    assert (choice.depth, choice.reason) == (0, "cost_model")


def test_draft_cost_counts_against_a_depth():
    verify = (10.0, 11.0, 12.0, 13.0, 14.0)
    assert propose(table_of(verify, draft=(0.0, 20.0, 40.0, 60.0, 80.0))).depth == 0


def test_above_the_cap_it_is_zero_without_reading_the_table():
    assert propose(UntouchableTable(), n=33, cap=32) == DepthChoice(depth=0, reason="over_cap")
    assert propose(table_of((10.0, 11.0, 12.0, 13.0, 14.0)), n=32, cap=32).reason == "cost_model"


def test_the_speed_floor_is_relative_to_depth_one():
    # Depth 2 is the most frugal but slow: 3 tokens in 30 ms against depth 1's 2 in 10 ms.
    table = table_of((10.0, 10.0, 30.0, 99.0, 99.0), joules=(10.0, 10.0, 5.0, 99.0, 99.0))
    assert propose(table, prior=(1.0,), slack=0.1).depth == 1
    assert propose(table, prior=(1.0,), slack=0.6).depth == 2


def test_a_depth_below_the_speed_floor_cannot_win_even_a_tie():
    # Depth 0 matches depth 1's tokens per joule but is half as fast.
    assert propose(table_of((2.0, 1.0, 1.0, 1.0, 1.0), joules=(1.0,) * 5), prior=(0.0,),
                   max_k=1, slack=0.0).depth == 1


def test_without_depth_one_the_floor_is_depth_zeros():
    table = table_of((10.0, 25.0, 99.0), joules=(10.0, 5.0, 99.0), depths=(0, 2, 4))
    assert propose(table, prior=(1.0,), slack=0.0).depth == 2  # 3 / 25 ms beats 1 / 10 ms
    assert propose(table, prior=(0.2,), slack=0.0).depth == 0  # 1.24 / 25 ms does not


def test_a_tie_keeps_the_shallower_depth():
    # Depths 1 and 2 both give 0.1 tokens per joule; depth 0 gives less.
    assert propose(table_of((12.0, 15.0, 17.5, 99.0, 99.0)), prior=(0.5,), slack=1.0).depth == 1
    # Nothing is accepted and every step costs the same: all tie, so no drafting.
    assert propose(table_of((10.0,) * 5), prior=(0.0,)).depth == 0


def test_a_dearer_depth_does_not_hide_a_cheaper_deeper_one():
    # Non-monotone verify cost (measured: K=3 dearer than K=4).
    assert propose(table_of((10.0, 11.0, 12.0, 40.0, 13.0))).depth == 4


def test_max_k_bounds_the_search():
    assert propose(table_of((10.0, 11.0, 12.0, 13.0, 14.0)), max_k=2).depth == 2
    assert propose(table_of((10.0, 11.0, 12.0, 13.0, 14.0)), max_k=0).depth == 0


def test_widths_between_measured_ones_are_interpolated():
    dear = Cost(ms=40.0, joules=40.0)
    table = make_table(
        meta=META, widths=(1, 4), depths=(0, 1),
        verify=lambda n, k: Cost(ms=10.0, joules=10.0) if n == 1 or k == 0 else dear,
        draft=lambda n, k: Cost(ms=0.0, joules=0.0),
    )
    assert propose(table, n=1, prior=(0.9,), slack=1.0).depth == 1
    assert propose(table, n=2, prior=(0.9,), slack=1.0).depth == 0  # depth 1 costs 20 there


@pytest.mark.parametrize("prior, slack", [((1.5,), 0.1), ((0.5,), -0.1), ((math.nan,), 0.1)])
def test_out_of_range_inputs_are_refused(prior, slack):
    with pytest.raises(ValueError):
        propose(table_of((10.0,) * 5), prior=prior, slack=slack)


costs = st.floats(1.0, 100.0, allow_nan=False)


@st.composite
def planner_cases(draw):
    verify = draw(st.lists(costs, min_size=5, max_size=5))
    joules = draw(st.lists(costs, min_size=5, max_size=5))
    draft = draw(st.lists(st.floats(0.0, 50.0), min_size=5, max_size=5))
    prior = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5))
    return table_of(verify, draft, joules=joules), tuple(prior)


def spec_rates(table, prior, k):
    """Tokens per ms and per joule, straight from the spec's formula."""
    p = [prior[min(t, len(prior)) - 1] for t in range(1, k + 1)]
    tokens = 1 + sum(math.prod(p[:j]) for j in range(1, k + 1))
    cost = table.step_cost(1, k)
    return tokens / cost.ms, tokens / cost.joules


@settings(max_examples=300, deadline=None)
@given(case=planner_cases(), slack=st.floats(0.0, 1.0), max_k=st.integers(0, 4))
def test_propose_depth_is_the_best_feasible_depth(case, slack, max_k):
    table, prior = case
    choice = propose(table, prior=prior, max_k=max_k, slack=slack)
    rates = {k: spec_rates(table, prior, k) for k in range(max_k + 1)}
    floor = (1 - slack) * rates[min(1, max_k)][0]
    feasible = {k: r[1] for k, r in rates.items() if r[0] >= floor * (1 - 1e-12)}
    assert choice.depth in feasible
    assert feasible[choice.depth] >= max(feasible.values()) * (1 - 1e-9)
    chosen = feasible[choice.depth]
    assert all(feasible[k] < chosen * (1 + 1e-9) for k in feasible if k < choice.depth)


@settings(max_examples=300, deadline=None)
@given(case=planner_cases(), max_k=st.integers(0, 4))
def test_balanced_is_never_slower_than_plain_decode_and_latency_is_the_fastest(case, max_k):
    table, prior = case
    rates = {k: spec_rates(table, prior, k) for k in range(max_k + 1)}
    balanced = propose_depth(1, table=table, prior=prior, max_k=max_k, slack=0.1, mtp_max_seqs=32, objective="balanced")
    assert rates[balanced.depth][0] >= rates[0][0] * (1 - 1e-9)
    best = max(math.sqrt(r[0] * r[1]) for r in rates.values() if r[0] >= rates[0][0] * (1 - 1e-12))
    assert math.sqrt(rates[balanced.depth][0] * rates[balanced.depth][1]) >= best * (1 - 1e-9)
    latency = propose_depth(1, table=table, prior=prior, max_k=max_k, slack=0.1, mtp_max_seqs=32, objective="latency")
    assert rates[latency.depth][0] >= max(r[0] for r in rates.values()) * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@given(case=planner_cases(), slacks=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)))
def test_more_slack_never_chooses_a_less_frugal_depth(case, slacks):
    table, prior = case
    low, high = (propose(table, prior=prior, slack=s) for s in sorted(slacks))
    # Ties within 1e-12 count as ties, so allow a little more than that.
    assert high.tokens_per_joule >= low.tokens_per_joule * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@given(case=planner_cases(), n=st.integers(0, 64), cap=st.integers(0, 64))
def test_the_cap_alone_decides_above_it(case, n, cap):
    table, prior = case
    choice = propose(UntouchableTable() if n > cap else table, n=n, prior=prior, cap=cap)
    assert (choice.reason == "over_cap") == (n > cap)
    assert choice.depth == 0 or n <= cap


# ---- sequence_depths -----------------------------------------------------------------------


def depths_of(table, drafts, prior=(0.9,), max_k=4, row_budget=16, **kw):
    return sequence_depths(table, drafts, prior=prior, max_k=max_k, row_budget=row_budget, **kw)


FLAT = table_of((10.0,) * 5)  # verifying more rows costs nothing: every reachable row is taken


def test_a_row_that_does_not_pay_is_taken_when_a_cheaper_row_lies_beyond():
    # Tokens for R = 1..4: 1.9, 2.71, 3.44, 4.10; tokens per joule peaks at R = 2, dips at
    # R = 3 (verify dearer at 3 rows than 4), and is best at R = 4.
    table = table_of((10.0, 11.0, 12.0, 20.0, 13.0))
    assert depths_of(table, [logp(0.9, 0.9, 0.9, 0.9)]) == (4,)


def test_rows_that_do_not_pay_are_left_unverified():
    table = table_of((10.0, 11.0, 30.0, 40.0, 50.0))
    assert depths_of(table, [logp(0.9, 0.9, 0.9, 0.9)]) == (1,)


def test_every_sequence_starts_at_one_draft_even_a_hopeless_one():
    table = table_of((10.0, 50.0, 90.0, 130.0, 170.0))
    assert depths_of(table, [logp(1e-9, 1e-9), logp(0.9)]) == (1, 1)


def test_further_rows_go_to_the_highest_chained_acceptance():
    drafts = [logp(0.5, 0.5, 0.5), logp(0.9, 0.9, 0.9)]
    assert depths_of(FLAT, drafts, row_budget=4) == (1, 3)
    assert depths_of(FLAT, drafts, row_budget=5) == (2, 3)


def test_a_tie_goes_to_the_earlier_sequence():
    assert depths_of(FLAT, [logp(0.8, 0.8), logp(0.8, 0.8)], row_budget=3) == (2, 1)


def test_no_sequence_gets_more_drafts_than_it_has_or_than_max_k():
    drafts = [logp(0.9), logp(0.9) * 6, []]
    assert depths_of(FLAT, drafts, max_k=4) == (1, 4, 0)


def test_more_sequences_than_the_row_budget_verifies_nothing():
    assert depths_of(UntouchableTable(), [logp(0.9)] * 3, row_budget=2) == (0, 0, 0)
    assert depths_of(UntouchableTable(), [logp(0.9)] * 2, max_k=0) == (0, 0)
    assert depths_of(UntouchableTable(), []) == ()


def test_drafts_without_confidences_take_the_prior():
    drafts = [[], logp(0.5, 0.5, 0.5)]
    assert depths_of(FLAT, drafts, known_drafts=(3, 3), prior=(0.9,), row_budget=4) == (3, 1)
    assert depths_of(FLAT, drafts, known_drafts=(3, 3), prior=(0.1,), row_budget=4) == (1, 3)
    assert depths_of(FLAT, drafts, known_drafts=(0, 3), row_budget=4) == (0, 3)


def test_the_calibration_maps_confidence_to_acceptance():
    overconfident = AcceptanceCalibration(confidence=(-0.2, -0.1), acceptance=(0.9, 0.1))
    drafts = [[-0.1, -0.1], [-0.2, -0.2]]
    assert depths_of(FLAT, drafts, row_budget=3) == (2, 1)  # exp: the first is likelier
    assert depths_of(FLAT, drafts, row_budget=3, calibration=overconfident) == (1, 2)


@st.composite
def batches(draw):
    n = draw(st.integers(1, 3))
    drafts = [draw(st.lists(st.floats(-6.0, 0.0), max_size=3)) for _ in range(n)]
    known = tuple(draw(st.integers(0, 3)) if not d else 0 for d in drafts)
    verify = draw(st.lists(costs, min_size=5, max_size=5))
    prior = tuple(draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3)))
    return table_of(verify), drafts, known, prior


def brute_force_best(table, drafts, known, prior, max_k, row_budget):
    """The best tokens per verify joule over every allocation the invariants allow."""
    n, cal = len(drafts), table.calibration
    gains = []
    for conf, k in zip(drafts, known):
        p = [cal.p_accept(c) for c in conf] + [prior[min(t, len(prior)) - 1]
                                               for t in range(len(conf) + 1, k + 1)]
        gains.append([math.prod(p[:j]) for j in range(1, min(len(p), max_k) + 1)])
    best = None
    for alloc in itertools.product(*(range(min(1, len(g)), len(g) + 1) for g in gains)):
        rows = sum(alloc)
        if rows <= row_budget:
            tokens = n + sum(sum(g[:d]) for g, d in zip(gains, alloc))
            ratio = tokens / table.verify_cost(n, rows / n).joules
            best = ratio if best is None else max(best, ratio)
    return gains, best


@settings(max_examples=300, deadline=None)
@given(batch=batches(), max_k=st.integers(0, 3), row_budget=st.integers(0, 9))
def test_sequence_depths_is_optimal_and_within_every_limit(batch, max_k, row_budget):
    table, drafts, known, prior = batch
    depths = depths_of(table, drafts, prior=prior, max_k=max_k, row_budget=row_budget,
                       known_drafts=known)
    assert depths == depths_of(table, drafts, prior=prior, max_k=max_k, row_budget=row_budget,
                               known_drafts=known)  # deterministic
    n = len(drafts)
    if n > row_budget or max_k == 0:
        assert depths == (0,) * n
        return
    gains, best = brute_force_best(table, drafts, known, prior, max_k, row_budget)
    assert sum(depths) <= row_budget
    assert all(min(1, len(g)) <= d <= len(g) <= max_k for d, g in zip(depths, gains))
    tokens = n + sum(sum(g[:d]) for g, d in zip(gains, depths))
    ratio = tokens / table.verify_cost(n, sum(depths) / n).joules
    assert ratio >= best * (1 - 1e-9)


def test_no_clock_is_read(monkeypatch):
    def no_clock(*_):
        raise AssertionError("the planner read a clock")

    for name in ("time", "monotonic", "perf_counter", "process_time", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time, name, no_clock)
    table = table_of((10.0, 11.0, 12.0, 20.0, 13.0))
    first = (propose(table), depths_of(table, [logp(0.9, 0.8), logp(0.7)]))
    assert first == (propose(table), depths_of(table, [logp(0.9, 0.8), logp(0.7)]))
