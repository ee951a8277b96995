"""What-if replay: the pure policies re-run over a recorded decision trace (runtime/decisions.py).

`metrale replay TRACE.jsonl [--gate-margin X --window-steps N --slack S --objective O]` feeds each
recorded step to the policy that decided it, under the trace's own settings with any of these
changed, and compares its choice with the recorded one:
- the MTP gate (runtime/gate.py) is rebuilt from the header's settings and fed every step in order,
  as the scheduler fed it (width, context depth, the step that ran, its wall time and tokens);
- a controller decision is re-planned from what it read (each sequence's objective and acceptance,
  the cost cells at its width, the exploration allowance) with runtime/plan.py's propose_depth.
Where the replayed choice is the recorded one, it delivers what the trace measured. Where it differs,
its step is priced by the trace's own measurements: the mean wall time, joules and tokens of the
recorded steps of that kind, width and depth; for a controller step never measured so, the cost
cells the decision read and the tokens its acceptance estimates expect. The gate is then fed that
estimate, so later decisions follow from the counterfactual, as they would have.

With the settings the server ran with, every decision is reproduced (a trace that lost its oldest
steps to the ring starts its gate from a fresh state, and may differ until the gate settles).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from runtime.cost_table import Cost, CostTable, TableMeta
from runtime.decisions import StepTrace, TraceHeader
from runtime.eligibility import entry_pin_forces_verify
from runtime.gate import GateStep, MtpGate
from runtime.step_plan import SeqView, plan_step
from runtime.plan import expected_tokens


@dataclass(frozen=True)
class Choice:
    step: str  # "plain" | "mtp"
    depths: tuple[int, ...]
    pinned: bool = False
    exploring: bool = False


@dataclass(frozen=True)
class Delivered:
    tokens: float
    wall_s: float
    joules: float | None


@dataclass(frozen=True)
class StepResult:
    step: int
    decider: str
    recorded: Choice
    replayed: Choice
    actual: Delivered
    delivered: Delivered  # by the replayed choice
    estimated: bool  # the replayed choice's delivery is an estimate (it differs from the recorded one)

    @property
    def same(self) -> bool:
        return self.recorded == self.replayed


@dataclass
class Totals:
    steps: int = 0
    same: int = 0
    tokens: float = 0.0
    wall_s: float = 0.0
    joules: float = 0.0

    def add(self, d: Delivered) -> None:
        self.tokens += d.tokens
        self.wall_s += d.wall_s
        self.joules += d.joules or 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tok_j(self) -> float:
        return self.tokens / self.joules if self.joules > 0 else 0.0


@dataclass
class Replay:
    steps: list[StepResult] = field(default_factory=list)
    actual: Totals = field(default_factory=Totals)
    replayed: Totals = field(default_factory=Totals)

    def add(self, result: StepResult) -> None:
        self.steps.append(result)
        for totals, d in ((self.actual, result.actual), (self.replayed, result.delivered)):
            totals.steps += 1
            totals.same += result.same
            totals.add(d)


def recorded(trace: StepTrace) -> Choice:
    d = trace.decision
    return Choice(d.chosen, tuple(d.depths), d.pinned, d.exploring)


class Measured:
    """The trace's own costs: mean tokens, wall time and joules of its steps by (kind, width, depth)."""

    def __init__(self, steps: list[StepTrace]):
        sums: dict[tuple, list[float]] = {}
        for s in steps:
            key = (s.ran, s.width, max(s.decision.depths, default=0) if s.ran == "mtp" else 0)
            acc = sums.setdefault(key, [0, 0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += s.tokens
            acc[2] += s.wall_s
            acc[3] += s.joules or 0.0
        self.means = {k: Delivered(t / n, w / n, j / n) for k, (n, t, w, j) in sums.items()}

    def at(self, kind: str, width: int, depth: int) -> Delivered | None:
        return self.means.get((kind, width, depth if kind == "mtp" else 0))


# --- the gate -------------------------------------------------------------------------------------
def gate_choice(gate: MtpGate, trace: StepTrace, header: TraceHeader) -> Choice:
    """What SpeculationPolicy._gated would choose, with this gate, for this step."""
    d, plain = trace.decision, Choice("plain", (0,) * trace.width)
    if not d.gate.consulted:
        return plain
    gate.note_width(trace.width)
    gate.maybe_remeasure(d.context_depth)
    step = gate.next_step()
    depths = tuple(header.num_draft_tokens if ok else 0 for ok in d.eligible)
    if entry_pin_forces_verify(step, min_post_think_emitted=d.gate.entering, pin_tokens=header.entry_pin_tokens):
        return Choice("mtp", depths, pinned=True)
    return Choice("mtp", depths) if step is GateStep.MTP else plain


def replay_gate_step(gate: MtpGate, trace: StepTrace, header: TraceHeader, measured: Measured) -> StepResult:
    choice, actual = gate_choice(gate, trace, header), Delivered(trace.tokens, trace.wall_s, trace.joules)
    delivered, ran, pinned = actual, trace.ran, trace.ran_pinned
    if choice != recorded(trace):
        estimate = measured.at(choice.step, trace.width, max(choice.depths))
        if estimate is not None:  # never measured: the gate sees the step that ran
            delivered, ran, pinned = estimate, choice.step, choice.pinned
    gate.record(GateStep(ran), wall_s=delivered.wall_s, width=trace.width, tokens_emitted=delivered.tokens,
                pinned=pinned)
    gate.take_fresh_decision()
    return StepResult(trace.step, "gate", recorded(trace), choice, actual, delivered, delivered is not actual)


# --- the controller -------------------------------------------------------------------------------
def table_at(trace: StepTrace, optimistic: bool = False) -> CostTable:
    """The cost cells the decision read, as a one-width table (what propose_depth reads at that width);
    optimistic: the lower bounds exploration read (the cells themselves in traces from before them)."""
    ctl = trace.decision.controller
    meta = TableMeta(model_id="", drafter=trace.drafter, machine="", dtype="", blas="", energy_source="", date="")
    row = lambda cells: (tuple(Cost(ms=ms, joules=j) for ms, j in cells),)  # noqa: E731
    verify, draft = (ctl.optimistic_verify or ctl.verify, ctl.optimistic_draft or ctl.draft) if optimistic \
        else (ctl.verify, ctl.draft)
    return CostTable(meta=meta, widths=(trace.width,), depths=tuple(ctl.depths), verify=row(verify), draft=row(draft))


def controller_choice(trace: StepTrace, header: TraceHeader, slack: float, objective: str | None) -> Choice:
    """The controller's plan (runtime/controller.py plan_step, the same code) on what the decision read."""
    d, ctl, n = trace.decision, trace.decision.controller, trace.width
    plain = Choice("plain", (0,) * n)
    if not any(d.eligible) or n > header.mtp_max_seqs or d.ahead:
        return plain
    table = table_at(trace)
    views = [SeqView(objective or s.objective, s.mean, s.upper) if ok and s is not None else None
             for s, ok in zip(ctl.seqs, d.eligible)]
    plan = plan_step(views, table, max_k=header.num_draft_tokens, slack=slack, mtp_max_seqs=header.mtp_max_seqs,
                     explore=ctl.explore, allowance_ms=ctl.allowance_ms if ctl.share > 0 else None,
                     continuing=ctl.continuing, optimistic=table_at(trace, optimistic=True))
    return Choice("mtp" if plan.speculates else "plain", plan.depths, exploring=plan.exploring)


def controller_delivery(trace: StepTrace, choice: Choice, measured: Measured) -> Delivered:
    """A controller step's delivery by another choice: the trace's own mean at that cell, else the cells
    it read, with the tokens its acceptance estimates expect."""
    n, k = trace.width, max(choice.depths)
    seqs = trace.decision.controller.seqs
    tokens = sum(expected_tokens(s.mean[:d]) if s and d else 1.0 for s, d in zip(seqs, choice.depths))
    mean = measured.at(choice.step, n, k)
    if mean is not None:
        return Delivered(tokens if choice.step == "mtp" else n, mean.wall_s, mean.joules)
    cost = table_at(trace).step_cost(n, k)
    return Delivered(tokens, cost.ms / 1e3, cost.joules)


def replay_controller_step(trace: StepTrace, header: TraceHeader, measured: Measured, slack: float,
                           objective: str | None) -> StepResult:
    choice, actual = controller_choice(trace, header, slack, objective), \
        Delivered(trace.tokens, trace.wall_s, trace.joules)
    same = choice == recorded(trace)
    delivered = actual if same else controller_delivery(trace, choice, measured)
    return StepResult(trace.step, "controller", recorded(trace), choice, actual, delivered, not same)


# --- the whole trace ------------------------------------------------------------------------------
def replay(header: TraceHeader, steps: list[StepTrace], *, margin: float | None = None,
           window_steps: int | None = None, slack: float | None = None, objective: str | None = None) -> Replay:
    changes = {k: v for k, v in (("margin", margin), ("window_steps", window_steps)) if v is not None}
    gate = MtpGate(msgspec.structs.replace(header.gate, **changes))
    measured, out = Measured(steps), Replay()
    slack = header.slack if slack is None else slack
    for trace in steps:
        decider = trace.decision.decider
        if decider == "gate":
            out.add(replay_gate_step(gate, trace, header, measured))
        elif decider == "controller":
            out.add(replay_controller_step(trace, header, measured, slack, objective))
        else:  # forced or off: nothing decided, the recorded step stands
            actual = Delivered(trace.tokens, trace.wall_s, trace.joules)
            out.add(StepResult(trace.step, decider, recorded(trace), recorded(trace), actual, actual, False))
    return out
