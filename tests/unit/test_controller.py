"""The online controller: per-sequence depths, objectives, exploration, conversations, persistence."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.content_phase import Phase
from runtime.controller import CATCH_UP_FREE, EXPLORE_BURST, OnlineController
from runtime.step_plan import SeqView, expected_loss, plan_step
from runtime.cost_prior import load_prior, save_learned
from runtime.cost_table import load_table
from runtime.eligibility import ThinkProgress
from runtime.exploration import ExplorationBudget
from runtime.messages import SamplingParams
from runtime.online_cost import OnlineCostModel
from runtime.cost_table import AcceptanceCalibration, Cost, make_table
from tests.unit.test_online_estimators import META, prior_table

_ids = itertools.count()


def seq(**params):
    return SimpleNamespace(request_id=f"s{next(_ids)}", think=ThinkProgress(post_think_emitted=50, emitted=50),
                           params=SamplingParams(**params))


def controller(by_depth=(0.3, 0.2, 0.1), verify=(80, 99, 103, 117, 130), share=0.01):
    costs = OnlineCostModel(prior_table(verify=verify, by_depth=by_depth), "test")
    return OnlineController(costs, max_k=3, slack=0.1, mtp_max_seqs=32, budget=ExplorationBudget(share=share))


def test_depth_follows_each_requests_own_acceptance():
    # Each drafting row costs its own draft (8 ms a position): a row that accepts nothing is not
    # worth its drafts, though its verify positions are padded in anyway.
    table = make_table(meta=META, widths=(1, 4), depths=(0, 1, 2, 3, 4),
                       verify=lambda n, k: Cost(ms=(80 + 10 * k) * n ** 0.5, joules=(80 + 10 * k) * n ** 0.5 / 50),
                       draft=lambda n, k: Cost(ms=8.0 * k * n, joules=8.0 * k * n / 50),
                       calibration=AcceptanceCalibration(by_depth=(0.7, 0.6, 0.5)))
    ctl = OnlineController(OnlineCostModel(table, "test"), max_k=3, slack=0.1, mtp_max_seqs=32)
    good, bad = seq(), seq()
    for _ in range(30):
        ctl.record_outcome(good, 3, 3)
        ctl.record_outcome(bad, 3, 0)
        ctl.step_passed([good, bad])
    plan = ctl.plan([good, bad], [True, True], explore=False)
    assert plan.depths[0] >= 2 and plan.depths[1] == 0


def test_objectives_are_honoured_per_sequence_in_one_batch():
    # The verify of depth is nearly free, each row's drafts cost joules but no time: the latency
    # request drafts, the energy request stays plain (its drafts would cost it more joules than its
    # tokens gain), and all drafting rows share one depth (the verifier pads to the deepest).
    table = make_table(meta=META, widths=(1, 4), depths=(0, 1, 2, 3),
                       verify=lambda n, k: Cost(ms=80.0 + 0.5 * k, joules=1.6 + 0.05 * k),
                       draft=lambda n, k: Cost(ms=0.0, joules=0.8 * n * k),
                       calibration=AcceptanceCalibration(by_depth=(0.8, 0.8, 0.8)))
    ctl = OnlineController(OnlineCostModel(table, "test"), max_k=3, slack=0.9, mtp_max_seqs=32)
    plan = ctl.plan([seq(objective="latency"), seq(objective="energy"), seq(objective="balanced")],
                    [True] * 3, explore=False)
    assert plan.depths[0] == 3 and plan.depths[1] == 0 and plan.depths[2] in (0, 3)


def test_exploration_runs_only_on_its_allowance_and_costs_its_share():
    ctl = controller(by_depth=(0.2, 0.1, 0.05))
    s = seq()
    assert not ctl.plan([s], [True]).speculates  # nothing saved up yet
    for _ in range(200):
        ctl.record_plain(1, 80.0, 1.6)
    plan = ctl.plan([s], [True])
    assert plan.exploring and plan.speculates
    ctl.record_spec(plan, [s], verify_depth=max(plan.depths), verify_ms=99.0, verify_j=2.0, draft_width=1,
                    draft_ms=3.0, draft_j=0.06, tokens=1)
    assert 0 < ctl.budget.spent_ms <= ctl.budget.earned_ms


def test_a_conversation_starts_from_its_last_turn():
    ctl = controller(by_depth=(0.3, 0.2, 0.1))
    first = seq(conversation="c1")
    for _ in range(20):
        ctl.record_outcome(first, 3, 3)
        ctl.step_passed([first])
    ctl.end(first)
    second, stranger = seq(conversation="c1"), seq(conversation="c2")
    assert ctl.control(second).acceptance.mean(Phase.ANSWER, 1)[0] > \
        ctl.control(stranger).acceptance.mean(Phase.ANSWER, 1)[0] + 0.1


def test_the_learned_table_is_saved_and_is_the_next_starts_prior(tmp_path, monkeypatch):
    import runtime.calibrate as calibrate

    monkeypatch.setattr(calibrate, "SHIPPED_DIR", tmp_path / "none")
    log = structlog.get_logger()
    costs = OnlineCostModel(prior_table(), "foreign-shipped")
    for _ in range(100):
        costs.observe("verify", 1, 0, 40.0, 0.8)  # this machine is twice as fast as the prior's
    path = calibrate.table_path("m", "mtp", str(tmp_path))
    save_learned(costs, path, machine="this cpu", blas="openblas", energy_source="cpu_proxy", log=log)
    saved = load_table(path)
    assert saved.meta.machine == "this cpu" and abs(saved.verify_cost(1, 2).ms - 50.0) < 3.0
    table, source = load_prior("m", "mtp", str(tmp_path), "this cpu", log)
    assert source == "cache" and table.verify == saved.verify
    assert load_prior("m", "mtp", str(tmp_path), "another cpu", log)[1] == "foreign-cache"
    # Learned under OpenBLAS, served under MKL: a prior to correct, not this server's own table.
    assert load_prior("m", "mtp", str(tmp_path), "this cpu", log, blas="mkl (/lib/x.so) | stock")[1] == "foreign-cache"
    assert load_prior("m", "mtp", str(tmp_path), "this cpu", log, blas="openblas (/lib/y.so) | stock")[1] == "cache"
    assert load_prior("m", "mtp", str(tmp_path), "this cpu", log,
                      blas="openblas | rows kernel on for 4-8 rows")[1] == "foreign-cache"


def test_plain_steps_of_requests_that_never_draft_buy_no_exploration():
    ctl = controller()
    for _ in range(100):
        ctl.record_plain(1, 80.0, 1.6, chosen=False)  # e.g. disable_mtp: nobody could have drafted
        ctl.step_starting(0.0)
    assert ctl.budget.earned_ms == 0.0 and ctl.costs.observations == 100


def test_an_exploration_runs_as_a_burst_and_pays_for_the_cold_step_after_it():
    ctl = controller(by_depth=(0.2, 0.1, 0.05))
    s = seq()
    for _ in range(400):
        ctl.record_plain(1, 80.0, 1.6)
    plans = []
    for _ in range(6):
        plan = ctl.plan([s], [True])
        plans.append(plan.exploring)
        if not plan.speculates:
            break
        ctl.record_spec(plan, [s], verify_depth=max(plan.depths), verify_ms=99.0, verify_j=2.0, draft_width=1,
                        draft_ms=3.0, draft_j=0.06, tokens=1)
    assert plans[:EXPLORE_BURST] == [True] * EXPLORE_BURST
    spent = ctl.budget.spent_ms
    ctl.record_plain(1, 120.0, 2.4)  # the step after: no lookahead was in flight
    assert ctl.budget.spent_ms > spent + 30.0 and not ctl.cold_next


def test_a_burst_starts_only_where_the_allowance_covers_all_of_it():
    """Each exploring step loses what the plan expected: the allowance is never overdrawn, so over
    any span exploration costs its share of plain decode (a burst started on one step's worth
    overdrew it by three steps)."""
    ctl = controller(by_depth=(0.2, 0.1, 0.05))
    s, bursts, lowest = seq(), 0, 0.0
    for _ in range(3000):
        plan = ctl.plan([s], [True])
        if not plan.speculates:
            ctl.record_plain(1, 80.0, 1.6)
            continue
        bursts += not ctl.burst_left
        loss = expected_loss(ctl.costs.table(), ctl.views_of([s]), plan.depths)
        plain = ctl.costs.table().step_cost(1, 0).ms
        ctl.record_spec(plan, [s], verify_depth=max(plan.depths), verify_ms=plain + loss - 3.0, verify_j=2.0,
                        draft_width=1, draft_ms=3.0, draft_j=0.06, tokens=1)
        ctl.step_starting(0.0)
        lowest = min(lowest, ctl.budget.allowance_ms)
    assert bursts >= 2 and lowest >= -1e-6


def test_a_cold_plain_step_after_a_speculative_one_does_not_teach_the_plain_cost():
    """The step after a verify with no lookahead started pays a whole forward's latency: a transition.
    Counted as plain decode's cost, plain would look dearer the more the server speculates."""
    ctl = controller(by_depth=(0.9, 0.9, 0.9))
    s = seq()
    plan = ctl.plan([s], [True])
    assert plan.speculates
    for cold in (True, False):
        ctl.record_spec(plan, [s], verify_depth=max(plan.depths), verify_ms=99.0, verify_j=2.0, draft_width=1,
                        draft_ms=3.0, draft_j=0.06, tokens=2)
        if not cold:
            ctl.ahead_started()  # the scheduler started the next plain step right after the verify
        ctl.step_starting(0.0)
        before = ctl.costs.cost("verify", 1, 0).ms
        ctl.record_plain(1, 200.0, 4.0)
        ctl.step_starting(0.0)
        assert (ctl.costs.cost("verify", 1, 0).ms == before) == cold


def test_a_step_costs_what_it_takes_from_one_start_to_the_next():
    """The scheduler's time after a step (streaming, deciding) is that step's: hidden under a plain
    step's lookahead, paid by a speculative one. Where something else ran between, it is left out."""
    ctl = controller(by_depth=(0.9, 0.9, 0.9))
    s = seq()
    plan = ctl.plan([s], [True])
    spec = dict(verify_depth=max(plan.depths), verify_ms=90.0, verify_j=1.8, draft_width=1, draft_ms=3.0,
                draft_j=0.06, tokens=2)
    ctl.record_spec(plan, [s], **spec)
    ctl.step_starting(None)  # a prefill ran between: the gap is not the step's
    ctl.costs.flush()  # learned now, not once plain steps follow (runtime/online_cost.py)
    alone = ctl.costs.cost("verify", 1, max(plan.depths)).ms
    fresh = controller(by_depth=(0.9, 0.9, 0.9))
    fresh.record_spec(plan, [s], **spec)
    fresh.step_starting(30.0, 0.6)
    fresh.costs.flush()
    assert fresh.costs.cost("verify", 1, max(plan.depths)).ms > alone * 1.05


def test_a_draft_that_catches_up_first_is_not_the_draft_cells_cost():
    """The first draft after plain steps (or the prompt) absorbs what they fed in the same forward:
    it is a transition. The draft cell learns from drafts in a run of speculative steps only."""
    ctl = controller(by_depth=(0.9, 0.9, 0.9))
    s = seq()
    plan = ctl.plan([s], [True])
    depth = max(plan.depths)
    before = ctl.costs.cost("draft", 1, depth).ms
    spec = dict(verify_depth=depth, verify_ms=90.0, verify_j=1.8, draft_width=1, draft_ms=before * 6,
                draft_j=0.3, tokens=2)
    ctl.record_spec(plan, [s], **spec, caught_up=CATCH_UP_FREE + 40)
    ctl.step_starting(0.0)
    ctl.costs.flush()  # learned now, not once plain steps follow (runtime/online_cost.py)
    # The draft cell learned nothing (its verify moved the tempo, which scales every cell alike)
    assert not [c for c in ctl.costs.cells() if c["kind"] == "draft"] and ctl.catch_ups == 1
    ctl.record_spec(plan, [s], **spec, caught_up=CATCH_UP_FREE)
    ctl.step_starting(0.0)
    ctl.costs.flush()
    assert ctl.costs.cost("draft", 1, depth).ms > before * 1.5


def _explore_one(verify_ms, upper, mean=(0.01, 0.01, 0.01)):
    view = SeqView("balanced", mean, upper)
    return plan_step([view], _table(verify_ms), max_k=3, slack=0.1, mtp_max_seqs=32, explore=True, allowance_ms=1e6)


def test_exploration_tries_the_shallowest_depth_the_upper_bounds_pay_at():
    # The bounds' best is depth 3 (each draft nearly free, 0.9 accepted), yet depth 1 pays too: the
    # cheaper experiment, and the cell whose cost decides whether to draft at all.
    plan = _explore_one((80, 85, 90, 95), upper=(0.9, 0.9, 0.9))
    assert plan.exploring and plan.depths == (1,)
    # Depth 1 cannot pay even at the bounds (its verify dearer than depth 2's): depth 2 is tried.
    plan = _explore_one((80, 130, 100, 140), upper=(0.5, 0.5, 0.5))
    assert plan.exploring and plan.depths == (2,)
    # Nothing pays at the bounds: no exploration.
    assert not _explore_one((80, 200, 300, 400), upper=(0.5, 0.5, 0.5)).speculates


rates3 = st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).map(tuple)


def _plan_one(verify_ms, mean, upper, allowance_ms=1e6, optimistic_ms=None):
    return plan_step([SeqView("balanced", mean, upper)], _table(verify_ms), max_k=3, slack=0.1, mtp_max_seqs=32,
                     explore=True, allowance_ms=allowance_ms, optimistic=_table(optimistic_ms or verify_ms))


@settings(max_examples=300, deadline=None)
@given(verify=st.lists(st.floats(20.0, 200.0), min_size=4, max_size=4), mean=rates3, lift=rates3,
       cheaper=st.floats(0.5, 1.0), allowance=st.floats(0.0, 1e4))
def test_where_the_mean_plan_drafts_exploration_goes_one_deeper_on_its_allowance(verify, mean, lift, cheaper,
                                                                                  allowance):
    """Where the mean plan drafts (depth d), an exploring step drafts d + 1, only where the bounds'
    plan drafts deeper than d and the allowance covers a burst's expected loss against the mean
    plan's own cost per token; with no uncertainty (bounds = means) it never explores."""
    upper = tuple(min(1.0, m + u) for m, u in zip(mean, lift))
    optimistic = [verify[0]] + [v * cheaper for v in verify[1:]]
    plan = _plan_one(verify, mean, upper, allowance, optimistic)
    mean_plan = plan_step([SeqView("balanced", mean, upper)], _table(verify), max_k=3, slack=0.1, mtp_max_seqs=32,
                          explore=False, allowance_ms=None)
    if not mean_plan.speculates or not plan.exploring:
        return
    assert plan.depths[0] == mean_plan.depths[0] + 1
    assert plan.baseline_ms_per_token is not None
    assert allowance >= EXPLORE_BURST * expected_loss(_table(verify), [SeqView("balanced", mean, upper)],
                                                      plan.depths, plan.baseline_ms_per_token)
    assert not _plan_one(verify, mean, mean, allowance).exploring


def _table(verify_ms):
    return make_table(meta=META, widths=(1,), depths=(0, 1, 2, 3),
                      verify=lambda n, k: Cost(ms=verify_ms[k], joules=verify_ms[k] / 50),
                      draft=lambda n, k: Cost(ms=0.0, joules=0.0),
                      calibration=AcceptanceCalibration(by_depth=(0.3, 0.2, 0.1)))


def test_code_at_depth_one_tries_depth_two_where_its_bound_may_pay_and_is_charged_against_depth_one():
    """The served case: depth 1 pays on the mean; depth 2, priced dear by a prior from elsewhere, may
    pay at its lower bound of cost: one exploring step at depth 2, its loss counted against depth
    1's expected cost per token. Once measured (bounds = estimates) and dearer, it is left alone."""
    mean, upper = (0.6, 0.4, 0.25), (0.65, 0.45, 0.3)
    plan = _plan_one((35.0, 40.0, 50.0, 60.0), mean, upper, optimistic_ms=(35.0, 40.0, 41.0, 44.0))
    assert plan.exploring and plan.depths == (2,)
    assert plan.baseline_ms_per_token == 40.0 / 1.6
    assert _plan_one((35.0, 40.0, 50.0, 60.0), mean, mean).depths == (1,)
    assert not _plan_one((35.0, 40.0, 50.0, 60.0), mean, upper, allowance_ms=0.0,
                         optimistic_ms=(35.0, 40.0, 41.0, 44.0)).exploring  # a loss the allowance cannot cover
    ctl = controller(by_depth=(0.6, 0.4, 0.25))
    ctl.planned = plan
    before = ctl.budget.allowance_ms
    explored = lambda tokens: ctl.record_spec(plan, [seq()], verify_depth=2, verify_ms=41.0, verify_j=0.8,  # noqa: E731
                                              draft_width=1, draft_ms=2.0, draft_j=0.04, tokens=tokens)
    explored(1)
    assert ctl.budget.allowance_ms == before - (43.0 - 25.0)  # charged against depth 1's 25 ms a token
    explored(3)
    assert ctl.budget.allowance_ms == before - (43.0 - 25.0)  # a lucky step is not refunded


def test_a_step_in_which_a_sequence_joins_teaches_no_cell():
    """A sequence's first decode step after its prefill is a transition, whatever the step runs."""
    ctl = controller(by_depth=(0.2, 0.1, 0.05))
    s = seq()
    for _ in range(40):
        ctl.record_plain(1, 80.0, 1.6)
        ctl.step_starting(0.5)
    observed = ctl.costs.observations
    plan = ctl.plan([s], [True])
    ctl.record_spec(plan, [s], verify_depth=max(plan.depths) or 1, verify_ms=150.0, verify_j=3.0, draft_width=1,
                    draft_ms=3.0, draft_j=0.06, tokens=1, joining=True)
    ctl.step_starting(0.5)
    ctl.record_plain(1, 150.0, 3.0, joining=True)
    ctl.step_starting(0.5)
    assert ctl.costs.observations == observed
    ctl.record_plain(1, 80.0, 1.6)  # the steps after it are learned
    ctl.step_starting(0.5)
    assert ctl.costs.observations == observed + 1


def test_a_step_that_traced_a_compiled_graph_teaches_no_cell_and_costs_exploration_nothing():
    ctl = controller(by_depth=(0.2, 0.1, 0.05))
    s = seq()
    for _ in range(400):
        ctl.record_plain(1, 80.0, 1.6)
    plan = ctl.plan([s], [True])
    assert plan.exploring
    observed, allowance = ctl.costs.observations, ctl.budget.allowance_ms
    ctl.record_spec(plan, [s], verify_depth=max(plan.depths), verify_ms=400.0, verify_j=8.0, draft_width=1,
                    draft_ms=3.0, draft_j=0.06, tokens=1, traced=True)
    ctl.step_starting(0.5)
    ctl.record_plain(1, 300.0, 6.0, traced=True)
    ctl.step_starting(0.5)
    assert ctl.costs.observations == observed and ctl.budget.allowance_ms >= allowance
    assert ctl.snapshot()["cost_model"]["steps_tracing"] == 2
    ctl.record_plain(1, 80.0, 1.6)  # an untraced step is learned again
    ctl.step_starting(0.5)
    assert ctl.costs.observations == observed + 1
