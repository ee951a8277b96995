"""The hyper admission gate (spec/hyper.md): one request at a time, and a width seam for rows the
request generates itself.

A request is admitted with a ticket (admit never blocks); once its turn comes, bind(ticket, singleton)
gives the callable that runs it: at width 1 the untouched serial closure, at width > 1 the installed
width executor's run_cohort(plan, singleton), which must still call the singleton for the serial part.
The ticket is settled when that run ends: completed, or failed on any exception. A ticket released
before it started counts as abandoned. The cap of one is no lock here: the scheduler binds the next
ticket only after the last run ended, and every model call goes through the owner's one FIFO.

A run may be a plain call (the spec's examples, the unit tests) or an async iterator of steps (the
scheduler's runs, one step per iteration); the gate settles the latter when it is exhausted, raises,
or is closed (a client's cancel ends it without error: completed).

Pure: no asyncio, no MLX; the clock is passed in (time.monotonic by default).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

HYPER_ADMISSION_CAP = 1
STAGE = "h0"
PASSTHROUGH = "serial_b1"
SINGLETON_REASON = "h0_singleton_passthrough"
SUMMARY_SAMPLES = 256  # queue_wait_s and run_s summarise this many latest runs


@dataclass(frozen=True)
class HyperRequestMeta:
    request_id: str
    prompt_tokens: int
    generation_mode: str = "mtp"  # "mtp": may speculate; "ar": plain decode only (disable_mtp)


@dataclass(frozen=True)
class HyperCohortPlan:
    """Width N = one real row plus N - 1 rows the request generates itself."""

    width: int
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.width, int) or self.width < 1:
            raise ValueError(f"a cohort's width must be an integer of at least 1, got {self.width!r}")


SINGLETON_PLAN = HyperCohortPlan(width=1, reason=SINGLETON_REASON)


class HyperWidthExecutor(Protocol):
    def plan(self, meta: HyperRequestMeta) -> HyperCohortPlan: ...

    def run_cohort(self, plan: HyperCohortPlan, singleton: Callable[[], Any]) -> Any: ...


@dataclass
class HyperTicket:
    request_id: str
    prompt_tokens: int
    admitted_at: float
    started_at: float | None = None
    finished: bool = False
    outcome: str | None = None  # completed | failed | abandoned


class HyperAdmissionGate:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.executor: HyperWidthExecutor | None = None
        self.width = 1  # the live width: of the step running now
        self.queued = 0  # admitted, not started, not released
        self.active = 0  # started, not settled
        self.totals: Counter[str] = Counter()
        self.queue_wait_s: deque[float] = deque(maxlen=SUMMARY_SAMPLES)
        self.run_s: deque[float] = deque(maxlen=SUMMARY_SAMPLES)
        self.requests_by_width: Counter[int] = Counter()
        self.steps_by_width: Counter[int] = Counter()
        self.forks = Counter(rows_launched=0, rows_committed=0, attempts=0, wins=0)

    # --- the width seam ----------------------------------------------------------------------------
    def install_width_executor(self, executor: HyperWidthExecutor) -> None:
        missing = [m for m in ("plan", "run_cohort") if not callable(getattr(executor, m, None))]
        if missing:
            raise TypeError(f"a width executor needs plan(meta) and run_cohort(plan, singleton); "
                            f"{type(executor).__name__} has no {' or '.join(missing)}")
        self.executor = executor

    def clear_width_executor(self) -> None:
        self.executor = None

    @property
    def width_executor_installed(self) -> bool:
        return self.executor is not None

    def plan_cohort(self, meta: HyperRequestMeta) -> HyperCohortPlan:
        """The executor's plan for this request; the singleton plan when none is installed."""
        if self.executor is None:
            return SINGLETON_PLAN
        plan = self.executor.plan(meta)
        if not isinstance(plan, HyperCohortPlan):
            raise TypeError(f"{type(self.executor).__name__}.plan returned {type(plan).__name__}, "
                            "not a HyperCohortPlan")
        return plan

    def record_cohort_width(self, width: int) -> None:
        """A request ran with this width at its widest."""
        self.requests_by_width[int(width)] += 1

    def set_live_width(self, width: int) -> None:
        self.width = int(width)
        self.steps_by_width[self.width] += 1

    def record_fork(self, rows_launched: int, rows_committed: int) -> None:
        """One step with self-generated rows: how many ran beside the real one, how many were kept."""
        self.forks["attempts"] += 1
        self.forks["rows_launched"] += rows_launched
        self.forks["rows_committed"] += rows_committed
        self.forks["wins"] += rows_committed > 0

    # --- tickets -----------------------------------------------------------------------------------
    def admit(self, *, request_id: str, prompt_tokens: int) -> HyperTicket:
        """A ticket for a request entering the queue; never blocks, never refuses."""
        self.totals["admitted"] += 1
        self.queued += 1
        return HyperTicket(request_id, int(prompt_tokens), admitted_at=self.clock())

    def bind(self, ticket: HyperTicket, singleton: Callable[[], Any], *, generation_mode: str = "mtp") -> Callable[[], Any]:
        """The callable that runs the request: its plan's width picks the singleton or the executor."""
        if ticket.started_at is not None or ticket.finished:
            raise ValueError(f"ticket {ticket.request_id} was already bound or released")

        def run() -> Any:
            if ticket.started_at is not None or ticket.finished:
                raise ValueError(f"ticket {ticket.request_id} has run or was released")
            self._start(ticket)
            try:
                plan = self.plan_cohort(HyperRequestMeta(ticket.request_id, ticket.prompt_tokens, generation_mode))
                if plan.width == 1:
                    result = singleton()
                elif self.executor is None:
                    raise RuntimeError(f"a width-{plan.width} plan needs an installed width executor")
                else:
                    result = self.executor.run_cohort(plan, singleton)
            except BaseException:
                self._settle(ticket, "failed")
                raise
            if hasattr(result, "__anext__"):
                return self._settled_steps(ticket, result)
            self._settle(ticket, "completed")
            return result

        return run

    def release(self, ticket: HyperTicket) -> None:
        """The request left; a ticket that never started is counted abandoned. Safe to repeat."""
        if ticket.finished:
            return
        if ticket.started_at is None:
            ticket.finished, ticket.outcome = True, "abandoned"
            self.queued -= 1
            self.totals["abandoned_before_start"] += 1

    async def _settled_steps(self, ticket: HyperTicket, steps):
        """The run's steps, settling the ticket when they end, raise, or are closed early."""
        outcome = "failed"
        try:
            async for item in steps:
                yield item
            outcome = "completed"
        except GeneratorExit:
            outcome = "completed"  # closed by the scheduler: the request ended without an error
            raise
        finally:
            if hasattr(steps, "aclose"):
                await steps.aclose()
            self._settle(ticket, outcome)

    def _start(self, ticket: HyperTicket) -> None:
        if self.active >= HYPER_ADMISSION_CAP:  # the scheduler binds one at a time: this is a bug
            raise RuntimeError(f"{ticket.request_id} started while {self.active} run(s) are active "
                               f"(cap {HYPER_ADMISSION_CAP})")
        ticket.started_at = self.clock()
        self.queued -= 1
        self.active += 1
        self.queue_wait_s.append(ticket.started_at - ticket.admitted_at)

    def _settle(self, ticket: HyperTicket, outcome: str) -> None:
        if ticket.finished:
            return
        ticket.finished, ticket.outcome = True, outcome
        self.active -= 1
        self.totals[outcome] += 1
        self.run_s.append(self.clock() - ticket.started_at)
        self.width = 1

    # --- visible -----------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The scheduler.hyper block of /health (the reference's keys, plus steps_by_width)."""
        return {"stage": STAGE, "admission_cap": HYPER_ADMISSION_CAP, "width": self.width,
                "passthrough": PASSTHROUGH, "width_executor_installed": self.width_executor_installed,
                "active": self.active, "queue_depth": self.queued,
                "admitted_total": self.totals["admitted"], "completed_total": self.totals["completed"],
                "failed_total": self.totals["failed"],
                "abandoned_before_start_total": self.totals["abandoned_before_start"],
                "queue_wait_s": summary(self.queue_wait_s), "run_s": summary(self.run_s),
                "width_stats": {"requests_by_width": dict(sorted(self.requests_by_width.items())),
                                "steps_by_width": dict(sorted(self.steps_by_width.items())),
                                "self_spec_rows_launched": self.forks["rows_launched"],
                                "self_spec_rows_committed": self.forks["rows_committed"],
                                "fork_attempts": self.forks["attempts"], "fork_wins": self.forks["wins"]}}


def summary(samples) -> dict:
    """count, mean, p50, p95 and max of the samples (None where there are none)."""
    values = sorted(samples)
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "max": None}

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 6)

    return {"count": len(values), "mean": round(sum(values) / len(values), 6), "p50": at(0.5), "p95": at(0.95),
            "max": round(values[-1], 6)}
