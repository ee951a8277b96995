"""The hyper admission gate (runtime/hyper.py): every rule of spec/hyper.md and its invariants."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.hyper import (
    HYPER_ADMISSION_CAP, PASSTHROUGH, SINGLETON_PLAN, STAGE, HyperAdmissionGate, HyperCohortPlan, HyperRequestMeta,
)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Forking:
    """A width executor that plans `width` and calls the singleton, as the spec's example does."""

    def __init__(self, width: int):
        self.width, self.seen = width, []

    def plan(self, meta):
        self.seen.append(meta)
        return HyperCohortPlan(width=self.width, reason="test_fork")

    def run_cohort(self, plan, singleton):
        return {**singleton(), "spec_rows": plan.width - 1}


def test_constants_and_the_singleton_plan():
    assert HYPER_ADMISSION_CAP == 1 and STAGE == "h0" and PASSTHROUGH == "serial_b1"
    assert SINGLETON_PLAN == HyperCohortPlan(width=1, reason="h0_singleton_passthrough")


@pytest.mark.parametrize("width", [0, -1, 1.5])
def test_a_plan_below_width_one_is_an_error(width):
    with pytest.raises(ValueError):
        HyperCohortPlan(width=width, reason="x")


def test_width_one_calls_the_untouched_singleton():
    gate = HyperAdmissionGate()
    ticket = gate.admit(request_id="req-42", prompt_tokens=128)
    bound = gate.bind(ticket, lambda: {"output": "hello"}, generation_mode="mtp")
    assert bound() == {"output": "hello"}
    snap = gate.snapshot()
    assert snap["completed_total"] == 1 and snap["active"] == 0 and snap["queue_depth"] == 0
    assert ticket.finished and ticket.outcome == "completed"


def test_width_above_one_calls_the_executor_with_the_request_meta():
    gate = HyperAdmissionGate()
    executor = Forking(4)
    gate.install_width_executor(executor)
    ticket = gate.admit(request_id="r", prompt_tokens=7)
    assert gate.bind(ticket, lambda: {"output": "x"}, generation_mode="ar")() == {"output": "x", "spec_rows": 3}
    assert executor.seen == [HyperRequestMeta("r", 7, "ar")]


def test_an_executor_planning_width_one_falls_back_to_the_singleton():
    gate = HyperAdmissionGate()
    gate.install_width_executor(Forking(1))
    ticket = gate.admit(request_id="r", prompt_tokens=1)
    assert gate.bind(ticket, lambda: "serial")() == "serial"


def test_install_refuses_an_object_without_plan_or_run_cohort():
    gate = HyperAdmissionGate()
    with pytest.raises(TypeError, match="run_cohort"):
        gate.install_width_executor(type("OnlyPlan", (), {"plan": lambda self, m: None})())
    with pytest.raises(TypeError, match="plan"):
        gate.install_width_executor(object())
    assert not gate.width_executor_installed


def test_clear_restores_the_singleton_plan():
    gate = HyperAdmissionGate()
    gate.install_width_executor(Forking(3))
    assert gate.width_executor_installed and gate.snapshot()["width_executor_installed"]
    gate.clear_width_executor()
    assert gate.plan_cohort(HyperRequestMeta("r", 1)) == SINGLETON_PLAN


def test_plan_cohort_refuses_a_result_that_is_not_a_plan():
    gate = HyperAdmissionGate()
    gate.install_width_executor(type("Bad", (), {"plan": lambda self, m: 2, "run_cohort": lambda self, p, s: 0})())
    with pytest.raises(TypeError, match="HyperCohortPlan"):
        gate.plan_cohort(HyperRequestMeta("r", 1))


def test_a_failing_run_is_settled_and_counted_failed():
    gate = HyperAdmissionGate()
    ticket = gate.admit(request_id="r", prompt_tokens=1)

    def boom():
        raise RuntimeError("owner died")

    with pytest.raises(RuntimeError):
        gate.bind(ticket, boom)()
    snap = gate.snapshot()
    assert snap["failed_total"] == 1 and snap["active"] == 0 and ticket.outcome == "failed"


def test_release_counts_a_ticket_abandoned_before_start_once():
    gate = HyperAdmissionGate()
    ticket = gate.admit(request_id="r", prompt_tokens=1)
    gate.release(ticket)
    gate.release(ticket)
    snap = gate.snapshot()
    assert snap["abandoned_before_start_total"] == 1 and snap["queue_depth"] == 0
    with pytest.raises(ValueError):
        gate.bind(ticket, lambda: None)


def test_release_after_a_run_changes_nothing():
    gate = HyperAdmissionGate()
    ticket = gate.admit(request_id="r", prompt_tokens=1)
    gate.bind(ticket, lambda: None)()
    gate.release(ticket)
    snap = gate.snapshot()
    assert snap["completed_total"] == 1 and snap["abandoned_before_start_total"] == 0


def test_a_bound_run_cannot_run_twice():
    gate = HyperAdmissionGate()
    bound = gate.bind(gate.admit(request_id="r", prompt_tokens=1), lambda: None)
    bound()
    with pytest.raises(ValueError):
        bound()


def test_the_cap_is_one_active_run():
    """Binding is free; starting a second run while one is active is the scheduler's bug, refused."""
    gate = HyperAdmissionGate()
    first = gate.admit(request_id="a", prompt_tokens=1)
    second = gate.admit(request_id="b", prompt_tokens=1)

    def nested():
        gate.bind(second, lambda: None)()

    with pytest.raises(RuntimeError, match="cap 1"):
        gate.bind(first, nested)()


def test_queue_wait_and_run_time_come_from_the_clock():
    clock = Clock()
    gate = HyperAdmissionGate(clock)
    ticket = gate.admit(request_id="r", prompt_tokens=1)
    clock.now = 2.0

    def work():
        clock.now = 5.0

    gate.bind(ticket, work)()
    snap = gate.snapshot()
    assert snap["queue_wait_s"]["mean"] == 2.0 and snap["run_s"]["mean"] == 3.0 and snap["run_s"]["count"] == 1


async def test_a_stepped_run_is_settled_when_its_steps_end():
    gate = HyperAdmissionGate()
    ticket = gate.admit(request_id="r", prompt_tokens=1)

    async def steps():
        for i in range(3):
            await asyncio.sleep(0)
            yield i

    run = gate.bind(ticket, steps)()
    assert gate.snapshot()["active"] == 1
    assert [i async for i in run] == [0, 1, 2]
    assert gate.snapshot()["completed_total"] == 1 and gate.snapshot()["active"] == 0


async def test_a_stepped_run_that_raises_is_failed_and_one_closed_early_completed():
    gate = HyperAdmissionGate()

    async def failing():
        yield 0
        raise RuntimeError("step failed")

    run = gate.bind(gate.admit(request_id="a", prompt_tokens=1), failing)()
    await anext(run)
    with pytest.raises(RuntimeError):
        await anext(run)

    async def forever():
        while True:
            yield 0

    run = gate.bind(gate.admit(request_id="b", prompt_tokens=1), forever)()
    await anext(run)
    await run.aclose()
    snap = gate.snapshot()
    assert snap["failed_total"] == 1 and snap["completed_total"] == 1 and snap["active"] == 0


def test_widths_and_forks_are_counted():
    gate = HyperAdmissionGate()
    gate.set_live_width(3)
    gate.record_fork(rows_launched=2, rows_committed=1)
    gate.record_fork(rows_launched=1, rows_committed=0)
    gate.record_cohort_width(3)
    gate.record_cohort_width(1)
    stats = gate.snapshot()["width_stats"]
    assert stats["requests_by_width"] == {1: 1, 3: 1} and stats["steps_by_width"] == {3: 1}
    assert (stats["self_spec_rows_launched"], stats["self_spec_rows_committed"]) == (3, 1)
    assert (stats["fork_attempts"], stats["fork_wins"]) == (2, 1)
    assert gate.snapshot()["width"] == 3


def test_the_snapshot_has_the_reference_keys():
    snap = HyperAdmissionGate().snapshot()
    assert {"stage", "admission_cap", "width", "passthrough", "width_executor_installed", "active", "queue_depth",
            "admitted_total", "completed_total", "failed_total", "abandoned_before_start_total", "queue_wait_s",
            "run_s", "width_stats"} <= snap.keys()
    assert {"requests_by_width", "self_spec_rows_launched", "self_spec_rows_committed", "fork_attempts",
            "fork_wins"} <= snap["width_stats"].keys()
    assert snap["stage"] == "h0" and snap["passthrough"] == "serial_b1" and snap["width"] == 1


# --- invariants over any sequence of events ---------------------------------------------------------
EVENTS = st.lists(st.tuples(st.sampled_from(["admit", "run_ok", "run_fail", "release", "release_again"]),
                            st.integers(0, 5)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(EVENTS)
def test_every_ticket_ends_exactly_once_and_the_counts_add_up(events):
    """admitted = completed + failed + abandoned + queued + active; active never exceeds the cap; a
    ticket never changes its outcome; queue_depth counts only tickets not started and not released."""
    gate = HyperAdmissionGate()
    tickets, outcomes = [], {}
    for kind, pick in events:
        if kind == "admit":
            tickets.append(gate.admit(request_id=f"r{len(tickets)}", prompt_tokens=pick))
            continue
        waiting = [t for t in tickets if t.started_at is None and not t.finished]
        pool = tickets if kind == "release_again" else waiting
        if not pool:
            continue
        ticket = pool[pick % len(pool)]
        if kind == "run_ok":
            gate.bind(ticket, lambda: None)()
        elif kind == "run_fail":
            with pytest.raises(KeyError):
                gate.bind(ticket, lambda: {}["missing"])()
        else:
            gate.release(ticket)
        for t in tickets:
            if t.finished:
                assert outcomes.setdefault(t.request_id, t.outcome) == t.outcome
        snap = gate.snapshot()
        assert snap["active"] <= HYPER_ADMISSION_CAP
        ended = snap["completed_total"] + snap["failed_total"] + snap["abandoned_before_start_total"]
        assert snap["admitted_total"] == ended + snap["queue_depth"] + snap["active"]
        assert snap["queue_depth"] == sum(1 for t in tickets if t.started_at is None and not t.finished)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.booleans())
def test_the_plan_width_picks_the_path(width, installed):
    gate = HyperAdmissionGate()
    if installed:
        gate.install_width_executor(Forking(width))
    ticket = gate.admit(request_id="r", prompt_tokens=3)
    result = gate.bind(ticket, lambda: {"output": "s"})()
    expect_fork = installed and width > 1
    assert result == ({"output": "s", "spec_rows": width - 1} if expect_fork else {"output": "s"})
