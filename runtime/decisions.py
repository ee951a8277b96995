"""Decision traces: every speculation decision with what it read, and what the step then measured.

At each step the scheduler calls `consult` right after the policy chose (before the step runs and
before anything learns from it), so the inputs are the ones the decision read: for the MTP gate its
estimates and the entry pin's input; for the online controller each sequence's objective, phase and
acceptance (mean and upper bound) and the cost-table cells at the step's width, with the
exploration allowance. After the step, `step_trace` adds the measurement (wall time, joules,
tokens, drafts verified and accepted per row) and telemetry keeps it in a bounded ring.
`metrale replay` (runtime/replay.py) re-runs the pure policies over these records.

JSONL: one TraceHeader line (the settings the server ran with), then one StepTrace line per step.
"""

from __future__ import annotations

import time

import msgspec

from runtime.eligibility import DEFAULT_ENTRY_PIN_TOKENS
from runtime.gate import GateConfig, GateStep

SCHEMA = 1


class SeqInputs(msgspec.Struct, frozen=True, kw_only=True):
    """One sequence as the controller read it (None fields where it is not eligible)."""

    objective: str = "balanced"
    phase: str | None = None
    mean: tuple[float, ...] = ()  # P(accept) by draft position, 1..max_k
    upper: tuple[float, ...] = ()  # the upper bounds exploration tests


class ControllerInputs(msgspec.Struct, frozen=True, kw_only=True):
    seqs: tuple[SeqInputs | None, ...]
    depths: tuple[int, ...]  # the table's depths
    verify: tuple[tuple[float, float], ...]  # (ms, joules) at this width, one per depth
    draft: tuple[tuple[float, float], ...]
    optimistic_verify: tuple[tuple[float, float], ...] = ()  # the cells at their lower bounds (exploration's)
    optimistic_draft: tuple[tuple[float, float], ...] = ()
    allowance_ms: float
    share: float
    explore: bool  # this step could explore (auto, not force, and no lookahead in flight)
    continuing: bool = False  # an exploration burst was going on


class GateInputs(msgspec.Struct, frozen=True, kw_only=True):
    consulted: bool  # choose() asked the gate: some sequence eligible, the width within the cap
    entering: int | None  # fewest tokens an eligible sequence emitted since </think> (the pin's input)
    state: dict  # MtpGate.snapshot() as the decision read it


class Consulted(msgspec.Struct, frozen=True, kw_only=True):
    """What one decision read and chose (before the step runs)."""

    decider: str  # "controller" | "gate" | "force" | "off"
    context_depth: int
    eligible: tuple[bool, ...]
    chosen: str
    depths: tuple[int, ...]
    pinned: bool
    exploring: bool
    reason: str
    ahead: bool = False  # a lookahead plain step was computing: the step was that one, nothing was decided
    gate: GateInputs | None = None
    controller: ControllerInputs | None = None  # None where no row was eligible: nothing was consulted


class StepTrace(msgspec.Struct, frozen=True, kw_only=True, tag="step", tag_field="type"):
    step: int
    at: float  # wall clock (seconds since the epoch), for the dashboard's axes
    drafter: str
    width: int
    active: int
    waiting: int
    decision: Consulted
    ran: str  # the step that ran ("plain" where no sequence had drafts)
    ran_pinned: bool
    wall_s: float
    joules: float | None
    tokens: int
    drafted: tuple[int, ...]  # per row: drafts verified
    accepted: tuple[int, ...]  # per row: drafts accepted
    draft_s: float = 0.0  # of wall_s, drafting (0 on a plain step)
    caught_up: int = 0  # the most tokens one of its drafts first caught up on (fed since its last draft)


class TraceHeader(msgspec.Struct, frozen=True, kw_only=True, tag="header", tag_field="type"):
    """The settings the decisions ran with: what a replay starts from."""

    schema: int = SCHEMA
    model: str = ""
    mode: str = "serial"
    drafter: str = "none"
    gate_setting: str = "auto"
    num_draft_tokens: int = 3
    mtp_max_seqs: int = 32
    entry_pin_tokens: int = 8
    slack: float = 0.1
    exploration_share: float = 0.01
    gate: GateConfig = GateConfig()


def header_from_config(config, model: str, drafter: str) -> TraceHeader:
    spec = config.spec
    pin = DEFAULT_ENTRY_PIN_TOKENS if spec.entry_pin_tokens is None else spec.entry_pin_tokens
    return TraceHeader(model=model, mode=config.scheduler.mode, drafter=drafter,
                       gate_setting=spec.mtp_gate or "auto", num_draft_tokens=spec.num_draft_tokens,
                       mtp_max_seqs=config.scheduler.mtp_max_seqs, entry_pin_tokens=pin,
                       slack=spec.cost_slack, exploration_share=spec.exploration_share, gate=config.gate)


# --- capture (called inside the scheduler) --------------------------------------------------------
def consult(policy, batch, choice, context_depth: int) -> Consulted:
    """What the policy's decision for this batch read, taken before the step runs."""
    eligible = tuple(policy.eligible_rows(batch))
    capped = len(batch) > policy.mtp_max_seqs
    decider = "controller" if policy.controller is not None else "gate" if policy.gate is not None \
        else policy.setting.value
    gate = ctl = None
    if decider == "controller" and any(eligible):  # what the plan read, captured when it was made or now
        # (a batch with no eligible row consults nothing: reading the cost tables for its trace rebuilt
        # them every 8 steps, ~0.3 ms a step of the event loop for requests that never draft)
        ctl = policy.read if policy.read is not None else controller_inputs(policy, batch, eligible)
    elif decider == "gate":
        entering = min((s.think.post_think_emitted for s, ok in zip(batch, eligible) if ok), default=None)
        gate = GateInputs(consulted=any(eligible) and not capped and not choice.ahead, entering=entering,
                          state=policy.gate.snapshot())
    return Consulted(decider=decider, context_depth=context_depth, eligible=eligible, chosen=choice.step.value,
                     depths=choice.depths, pinned=choice.pinned, exploring=choice.exploring, ahead=choice.ahead,
                     reason=reason(decider, choice, any(eligible), capped, gate), gate=gate, controller=ctl)


def controller_inputs(policy, batch, eligible) -> ControllerInputs:
    controller = policy.controller
    table = controller.costs.table()
    seqs, planned = [], controller.views_of(batch) or [None] * len(batch)  # plan()'s own, read once
    for seq, ok, view in zip(batch, eligible, planned):
        read = controller.consulted(seq, view) if ok else None
        seqs.append(None if read is None else SeqInputs(objective=read[0], phase=read[1], mean=read[2],
                                                         upper=read[3]))
    n, low = len(batch), controller.costs.optimistic_table()
    cells = lambda row: tuple((c.ms, c.joules) for c in row)  # noqa: E731
    return ControllerInputs(seqs=tuple(seqs), depths=table.depths, verify=cells(table.verify_row(n)),
                            draft=cells(table.draft_row(n)), optimistic_verify=cells(low.verify_row(n)),
                            optimistic_draft=cells(low.draft_row(n)),
                            allowance_ms=controller.budget.allowance_ms, share=controller.budget.share,
                            explore=policy.explore_allowed, continuing=policy.continuing)


def reason(decider: str, choice, any_eligible: bool, capped: bool, gate: GateInputs | None) -> str:
    """Why the step is what it is, in one word."""
    speculates = choice.step is GateStep.MTP
    if not any_eligible:
        return "not_eligible"
    if capped:
        return "over_cap"
    if choice.ahead:
        return "lookahead"
    if decider == "controller":
        return "exploring" if choice.exploring else "planner_speculates" if speculates else "planner_plain"
    if decider == "gate":
        if choice.pinned:
            return "entry_pin"
        probing = gate is not None and gate.state.get("probing")
        return "gate_probe" if probing else "gate_mtp" if speculates else "gate_serial"
    return "forced" if speculates else decider


def step_trace(consulted: Consulted, ran, *, step: int, drafter: str, width: int, active: int, waiting: int,
               wall_s: float, joules: float | None, tokens: int, outcomes=(), draft_s: float = 0.0,
               caught_up: int = 0) -> StepTrace:
    """The decision with the step's measurement; outcomes: (drafted, accepted) per row."""
    drafted = tuple(d for d, _ in outcomes) if outcomes else (0,) * width
    accepted = tuple(a for _, a in outcomes) if outcomes else (0,) * width
    return StepTrace(step=step, at=time.time(), drafter=drafter, width=width, active=active, waiting=waiting,
                     decision=consulted, ran=ran.step.value, ran_pinned=ran.pinned, wall_s=wall_s, joules=joules,
                     tokens=tokens, drafted=drafted, accepted=accepted, draft_s=draft_s, caught_up=caught_up)


# --- JSONL ----------------------------------------------------------------------------------------
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(TraceHeader | StepTrace)


def encode_line(record: TraceHeader | StepTrace) -> bytes:
    return _encoder.encode(record) + b"\n"


def read_trace(lines) -> tuple[TraceHeader, list[StepTrace]]:
    """A trace's header and its steps, in order (a trace without a header gets the defaults)."""
    header, steps = TraceHeader(), []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        record = _decoder.decode(line)
        if isinstance(record, TraceHeader):
            header = record
        else:
            steps.append(record)
    return header, steps
