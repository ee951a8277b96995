"""The online controller: each step's draft depth per sequence, from what this server measured.

Costs come from the online cost model (runtime/online_cost.py), corrected by every served step;
acceptance from each request's own verify outcomes, shrunk toward its content phase's
(runtime/acceptance_online.py, runtime/content_phase.py). For every eligible sequence the planner
(runtime/plan.py, propose_depth) picks the depth its objective prefers, given the batch width and
that sequence's posterior. A step speculates when some sequence's depth is at least 1.

Exploration: where no sequence's best estimate pays but the upper bound of its acceptance says a
draft might, the step may speculate to learn, at the shallowest depth the bounds pay at, paid for
by the exploration budget (runtime/exploration.py: at most 1% of plain decode time). This replaces the gate's fixed
probes and the entry pin while a cost table exists: both explore only where evidence leaves room.

Pure: no clock, no I/O, no asyncio.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from runtime.acceptance_online import Counts, PhasePriors, RequestAcceptance
from runtime.content_phase import Phase, PhaseTracker
from runtime.exploration import ExplorationBudget
from runtime.online_cost import OnlineCostModel
from runtime.plan import propose_depth
from runtime.plan_memo import PlanMemo
from runtime.step_plan import EXPLORE_BURST, Plan, SeqView, plan_step

@dataclass
class Learning:
    """What the scheduler needs to keep learning: save the learned table, build a controller from
    a self-calibrated table, and the self-calibration to run (None when a table was found)."""

    save: Callable[[OnlineCostModel], None]
    make_controller: Callable[[object, str], OnlineController]
    calibration: object | None = None  # a runtime.self_calibration.SelfCalibration


# A draft that first catches up on more tokens than this (fed by plain steps or the prompt since the
# drafter's last draft: the head absorbs them all in that forward) is a transition, not a draft's
# cost: counted, it priced every draft several times dearer than a run of them costs, so requests
# that would have paid at depth 1 decoded plainly.
CATCH_UP_FREE = 2
CONVERSATIONS = 1024  # conversations whose last posterior is kept (least recently used go first)


@dataclass(frozen=True)
class StepCost:
    """One step's measured costs, observed once the next step starts (its gap then known)."""

    width: int
    depth: int  # verified drafts per row (0: a plain step)
    verify_ms: float
    verify_j: float
    draft_width: int = 0
    draft_depth: int = 0
    draft_ms: float = 0.0
    draft_j: float = 0.0
    caught_up: int = 0  # the most tokens one of its drafts first caught up on


@dataclass
class RequestControl:
    """The controller's state of one request."""

    acceptance: RequestAcceptance
    objective: str = "balanced"
    text: PhaseTracker = field(default_factory=PhaseTracker)
    phase: Phase = Phase.ANSWER
    depth: int = 0  # chosen at the latest step
    explored: bool = False


class OnlineController:
    def __init__(self, costs: OnlineCostModel, *, max_k: int, slack: float, mtp_max_seqs: int,
                 budget: ExplorationBudget | None = None):
        self.costs, self.max_k, self.slack, self.mtp_max_seqs = costs, max_k, slack, mtp_max_seqs
        self.priors = PhasePriors(costs.prior.calibration.by_depth, depth=max(max_k, 1))
        self.budget = budget or ExplorationBudget()
        self.requests: dict[str, RequestControl] = {}
        self.conversations: OrderedDict[str, dict[Phase, Counts]] = OrderedDict()
        self.phase_speculates: dict[Phase, bool] = {}
        self.switches: list[tuple[Phase, bool]] = []  # phase decision flips not yet traced
        self.burst_left = 0  # exploring steps left in the current burst
        self.cold_next = False  # the next plain step follows a speculative one with no lookahead in flight
        self.unobserved: StepCost | None = None  # the latest step's costs, until the next one starts
        self.explored_last = False  # the latest speculative step explored
        self.planned = Plan(())  # the latest plan: what an exploring step is charged against
        self.catch_ups = 0  # drafts not counted as the draft cell's cost: they caught up first
        self.traced_steps = 0  # steps not counted as their cells' cost: they traced a compiled graph
        self.viewed: tuple[tuple[str, ...], list[SeqView | None]] = ((), [])  # the latest plan's batch and views
        self.memo = PlanMemo()  # the planner's answers per cost table: a plain run asks the same each step

    # --- requests --------------------------------------------------------------------------------
    def control(self, seq) -> RequestControl:
        ctl = self.requests.get(seq.request_id)
        if ctl is None:
            start = self.conversations.get(seq.params.conversation) if seq.params.conversation else None
            ctl = RequestControl(RequestAcceptance(self.priors, start), objective=seq.params.objective)
            self.requests[seq.request_id] = ctl
        return ctl

    def note_text(self, seq, delta: str) -> None:
        ctl = self.control(seq)
        ctl.text.advance(delta)
        ctl.phase = ctl.text.phase(seq.think.inside_think)

    def end(self, seq) -> None:
        """A request left: its evidence seeds the next turn of its conversation."""
        ctl = self.requests.pop(seq.request_id, None)
        if ctl is not None:
            ctl.acceptance.finish()
        key = seq.params.conversation
        if ctl is None or not key:
            return
        self.conversations[key] = {p: c.copy() for p, c in ctl.acceptance.counts.items()}
        self.conversations.move_to_end(key)
        while len(self.conversations) > CONVERSATIONS:
            self.conversations.popitem(last=False)

    # --- deciding --------------------------------------------------------------------------------
    def plan(self, batch, eligible: list[bool], explore: bool = True) -> Plan:
        n = len(batch)
        if n > self.mtp_max_seqs or not any(eligible):
            return Plan((0,) * n)
        table = self.costs.table()
        views = [self.view(seq) if ok else None for seq, ok in zip(batch, eligible)]
        self.viewed = (tuple(s.request_id for s in batch), views)
        plan = plan_step(views, table, max_k=self.max_k, slack=self.slack, mtp_max_seqs=self.mtp_max_seqs,
                         explore=explore, allowance_ms=self.budget.allowance_ms if self.budget.share > 0 else None,
                         continuing=self.burst_left > 0, optimistic=self.costs.optimistic_table(),
                         depths_of=self.memo.batch_depths)
        self.planned = plan
        for seq, depth in zip(batch, plan.depths):
            self.control(seq).depth = depth
        self._note_phase_decisions(batch, eligible, n, table)
        return plan

    def view(self, seq) -> SeqView:
        """What the plan reads of one sequence: its objective and acceptance (mean, upper bound)."""
        ctl = self.control(seq)
        acc = ctl.acceptance
        return SeqView(ctl.objective, acc.mean(ctl.phase, self.max_k), acc.upper(ctl.phase, self.max_k))

    def _note_phase_decisions(self, batch, eligible, n: int, table) -> None:
        """Each phase's own decision at this width, from its prior alone: a flip is traced."""
        for phase in {self.control(s).phase for s, ok in zip(batch, eligible) if ok}:
            prior = self.priors.mean(phase)
            choice = self.memo.answer(table, ("phase", n, tuple(prior)), lambda: propose_depth(
                n, table=table, prior=prior, max_k=self.max_k, slack=self.slack, mtp_max_seqs=self.mtp_max_seqs,
                objective="balanced"))
            speculates = choice.depth > 0
            if self.phase_speculates.get(phase) not in (None, speculates):
                self.switches.append((phase, speculates))
            self.phase_speculates[phase] = speculates

    def take_switches(self) -> list[tuple[Phase, bool]]:
        out, self.switches = self.switches, []
        return out

    # --- what happened ---------------------------------------------------------------------------
    def record_plain(self, width: int, ms: float, joules: float, chosen: bool = True, traced: bool = False,
                     joining: bool = False) -> None:
        """A plain step's cost. Only a step the controller chose plain (someone could have drafted)
        pays into the exploration allowance: requests that never draft buy no exploration. A cold
        step after a speculative one is a transition, not a plain step's cost: counting it would make
        plain decode look dearer the more the server speculates (and so speculate more). traced: the
        step paid for tracing a compiled graph (a shape's first use): not its shape's cost either.
        joining: a sequence took its first decode step in it (see `record_spec`)."""
        self.burst_left = 0
        if traced:
            self.traced_steps += 1
            self.cold_next = False
        elif joining:
            self.cold_next = False
        elif self.cold_next:
            if self.explored_last:
                self.budget.note_cold(ms, self.costs.table().step_cost(width, 0).ms)
            self.cold_next = False
        else:
            self.unobserved = StepCost(width, 0, ms, joules)
        if chosen:
            self.budget.note_chosen(ms)

    def step_starting(self, gap_ms: float | None, gap_j: float = 0.0) -> None:
        """The next step starts: the latest step's cost is observed with the scheduler's time after it
        (streaming its tokens, deciding), since a step costs what it takes from one start to the next:
        a plain step's lookahead hides that time, a speculative step pays it. gap_ms None: something
        else ran between (a prefill, a batch change), so the gap is not that step's."""
        cost, self.unobserved = self.unobserved, None
        if cost is None:
            return
        extra_ms, extra_j = (gap_ms, gap_j) if gap_ms is not None and gap_ms >= 0 else (0.0, 0.0)
        if cost.draft_width and cost.caught_up <= CATCH_UP_FREE:
            self.costs.observe("draft", cost.draft_width, cost.draft_depth, cost.draft_ms, cost.draft_j)
        elif cost.draft_width:
            self.catch_ups += 1
        self.costs.observe("verify", cost.width, cost.depth, cost.verify_ms + extra_ms, cost.verify_j + extra_j)

    def ahead_started(self) -> None:
        """The plain step after this speculative one is computing already: it will be warm."""
        self.cold_next = False

    def record_spec(self, plan: Plan, batch, *, verify_depth: int, verify_ms: float, verify_j: float,
                    draft_width: int, draft_ms: float, draft_j: float, tokens: int, caught_up: int = 0,
                    traced: bool = False, joining: bool = False) -> None:
        """A speculative step's costs (draft and verify apart) and its wall time in the budget;
        caught_up: the most tokens one of its drafts first caught up on. traced: it paid for tracing a
        compiled graph, once per shape and process, so it is neither its cells' cost nor exploration's
        loss: at width 4 a new shape's first step took 130-190 ms against ~90, one such step overdrew
        the allowance, and code, which pays 1.08x at depth 1 there, was never explored enough to draft.
        joining: a sequence took its first decode step since its prefill in it, a transition paid once
        per request whatever the step (its cache joins the batch, no lookahead ran for it): not its
        cell's cost. On a 2-core AMD EPYC such steps took 32-43 ms where a width-1 step took 19-23;
        learned, they moved the common tempo at every request's start, and with the mean of the steps
        after a spell (now their median, runtime/online_cost.py) one client's table read a depth-1
        step at 0.87-0.94x plain decode where it ran at 1.16x: it speculated at 0.87x plain tok/s."""
        n = len(batch)
        self.unobserved = None if traced or joining else StepCost(
            n, verify_depth, verify_ms, verify_j, draft_width, max(plan.depths), draft_ms, draft_j, caught_up)
        self.traced_steps += traced
        if plan.exploring:
            if not traced:
                baseline = self.planned.baseline_ms_per_token  # set only where it explored deeper
                self.budget.note_explored(verify_ms + draft_ms, baseline or self.costs.table().step_cost(n, 0).ms,
                                          tokens / n, refund=baseline is None)
            self.burst_left = EXPLORE_BURST - 1 if self.burst_left == 0 else self.burst_left - 1
        else:
            self.burst_left = 0
            self.budget.note_chosen(verify_ms + draft_ms)  # a step the planner chose earns, as a plain one does
        self.cold_next, self.explored_last = True, plan.exploring

    def record_outcome(self, seq, drafted: int, accepted: int) -> None:
        ctl = self.control(seq)
        if drafted:
            ctl.acceptance.note(ctl.phase, drafted, accepted)

    def step_passed(self, batch) -> None:
        self.viewed = ((), [])  # evidence fades now: the views are the last step's
        for seq in batch:
            ctl = self.control(seq)
            ctl.acceptance.step(ctl.phase)

    # --- visible ---------------------------------------------------------------------------------
    def describe_request(self, seq) -> dict:
        ctl = self.control(seq)
        return {"request_id": seq.request_id, "phase": ctl.phase.value, "objective": ctl.objective,
                "acceptance": [round(p, 3) for p in ctl.acceptance.mean(ctl.phase, self.max_k)],
                "depth": ctl.depth}

    def consulted(self, seq, view: SeqView | None = None) -> tuple[str, str, tuple[float, ...], tuple[float, ...]] | None:
        """Read-only, for decision traces: what plan() read for this sequence (objective, phase, the
        acceptance mean and upper bound up to max_k; `view`: as plan() computed it); None where no
        state is held for it."""
        ctl = self.requests.get(seq.request_id)
        if ctl is None:
            return None
        view = view or self.view(seq)
        return view.objective, ctl.phase.value, view.mean, view.upper

    def views_of(self, batch) -> list[SeqView | None] | None:
        """The views the latest plan computed, where it was this batch's (else None)."""
        ids, views = self.viewed
        return views if ids == tuple(s.request_id for s in batch) else None

    def snapshot(self, active=()) -> dict:
        return {"cost_model": self.costs.snapshot() | {"drafts_catching_up": self.catch_ups,
                                                       "steps_tracing": self.traced_steps},
                "phase_acceptance": self.priors.snapshot(),
                "phase_request_strength": self.priors.strengths(),
                "phase_speculates": {p.value: s for p, s in self.phase_speculates.items()},
                "exploration": self.budget.snapshot(), "conversations": len(self.conversations),
                "requests": [self.describe_request(s) for s in active]}
