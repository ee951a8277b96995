"""Per step, plain decode or the speculative step, and how deep each sequence drafts.

Two deciders, by what is known:
- with a cost table (a prior of any origin, corrected online): the online controller
  (runtime/controller.py) chooses each sequence's depth from measured costs and its own acceptance;
- without one (--spec-cost-model off): the MTP gate (runtime/gate.py, spec/mtp_gate.md) compares
  measured tok/s of both modes over windows, with its probes and the entry pin, at the configured K.
--mtp-gate force speculates whenever eligible at K, or, while a table exists, wherever the planner's
best estimate pays (no exploration, so the path does not depend on timing);
off never speculates. Settings arrive as values: environment variables are read once, into Config.

Pure policy (no asyncio, no MLX, no clock): the scheduler passes measured wall times in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from runtime.controller import OnlineController
from runtime.step_plan import Plan
from runtime.decisions import controller_inputs
from runtime.eligibility import (
    DEFAULT_ENTRY_PIN_TOKENS, GateSetting, ThinkMarkers, entry_pin_forces_verify, spec_dispatch_eligible,
)
from runtime.gate import GateConfig, GateDecision, GateStep, MtpGate
from runtime.plan import sequence_depths


@dataclass(frozen=True)
class StepChoice:
    step: GateStep
    depths: tuple[int, ...]  # drafts to ask of each sequence (0: a plain row)
    pinned: bool = False  # run under the entry pin: not recorded by the gate
    exploring: bool = False  # run to learn, charged to the exploration budget
    eligible: int = 0  # sequences that could have drafted this step
    ahead: bool = False  # the lookahead plain step already computing: nothing was decided


class SpeculationPolicy:
    def __init__(self, drafter: str, k: int, setting: GateSetting | str | None = None, *,
                 controller: OnlineController | None = None, pin_tokens: int | None = DEFAULT_ENTRY_PIN_TOKENS,
                 spec_think: bool = False, resume_guard: int = 0, think_markers: ThinkMarkers = ThinkMarkers(),
                 mtp_max_seqs: int = 32, gate_config: GateConfig = GateConfig(), suppress_tool_call: bool = False):
        self.drafter, self.k, self.mtp_max_seqs = drafter, k, mtp_max_seqs
        self.suppress_tool_call = suppress_tool_call  # spec/mtp_gate.md: a sequence in a tool call decodes plainly
        self.setting = GateSetting.OFF if drafter == "none" else GateSetting(setting or "auto")
        self.controller = controller
        self.gate = MtpGate(gate_config) if self.setting is GateSetting.AUTO and controller is None else None
        self.pin_tokens = DEFAULT_ENTRY_PIN_TOKENS if pin_tokens is None else pin_tokens
        self.spec_think = spec_think
        self.resume_guard, self.think_markers = resume_guard, think_markers
        self.last: StepChoice | None = None
        self.explore_allowed, self.continuing = False, False  # the controller's last plan could explore / was a burst
        self.planned = None  # (sequence ids, choice, what it read): the next step's plan, made at lookahead
        self.read = None  # what the current step's plan read, where it was made at the step before

    def use_controller(self, controller: OnlineController) -> None:
        """A cost table now exists (the self-calibration finished): the controller decides from here."""
        self.controller = controller
        self.gate = None

    @property
    def enabled(self) -> bool:
        return self.setting is not GateSetting.OFF

    def eligible(self, seq) -> bool:
        # Where measurement picks the path, rejection sampling draws differ by path: a seeded
        # sampled request decodes plainly so its seed reproduces its output.
        if self.setting is GateSetting.AUTO and seq.params.seed is not None and not seq.params.greedy:
            return False
        in_call = self.suppress_tool_call and seq.content.in_tool
        return spec_dispatch_eligible(seq.think, resume_guard=self.resume_guard, spec_think=self.spec_think,
                                      suppress_tool_call=in_call, disable_mtp=seq.params.disable_mtp)

    def choose(self, batch, context_depth: int, ahead: bool = False) -> StepChoice:
        """The step to run for this batch. Sequences not eligible take plain rows in a speculative step.
        ahead: a plain step is already computing (lookahead, started because next_is_plain said so),
        so this step is that plain step: drafting now would drop it, a whole forward lost (it was the
        dearest part of every speculative spell's first step). A change of mind waits one step."""
        eligible = self.eligible_rows(batch)
        plain = StepChoice(GateStep.PLAIN, (0,) * len(batch))
        planned, self.planned, self.read = self.planned, None, None
        self.explore_allowed = self.continuing = False
        if not any(eligible) or len(batch) > self.mtp_max_seqs:
            choice = plain
        elif ahead:  # the plain step next_is_plain decided on: its trace records what that read
            choice = dataclasses.replace(plain, ahead=True)
            self.read = planned[2] if planned is not None and planned[0] == _ids(batch) else None
        elif self.controller is not None and planned is not None and planned[0] == _ids(batch):
            choice, self.read = planned[1], planned[2]  # decided when the last step looked ahead
        elif self.controller is not None:
            choice = self._controlled(batch, eligible)
        else:
            choice = self._gated(batch, eligible, context_depth) or plain
        choice = dataclasses.replace(choice, eligible=sum(eligible))
        self.last = choice
        return choice

    def _controlled(self, batch, eligible) -> StepChoice:
        # Forced: the planner's depths with no exploration, so the path is fixed by the table alone.
        self.explore_allowed = self.setting is GateSetting.AUTO  # what the trace records
        self.continuing = self.controller.burst_left > 0
        plan: Plan = self.controller.plan(batch, eligible, explore=self.explore_allowed)
        step = GateStep.MTP if plan.speculates else GateStep.PLAIN
        return StepChoice(step, plan.depths, exploring=plan.exploring)

    def _gated(self, batch, eligible, context_depth) -> StepChoice | None:
        depths = tuple(self.k if ok else 0 for ok in eligible)
        if self.gate is None:  # forced
            return StepChoice(GateStep.MTP, depths)
        self.gate.note_width(len(batch))
        self.gate.maybe_remeasure(context_depth)
        step = self.gate.next_step()
        entering = min(s.think.post_think_emitted for s, ok in zip(batch, eligible) if ok)
        if entry_pin_forces_verify(step, min_post_think_emitted=entering, pin_tokens=self.pin_tokens):
            return StepChoice(GateStep.MTP, depths, pinned=True)
        return StepChoice(step, depths) if step is GateStep.MTP else None

    def allot(self, batch, confidences: list[tuple[float, ...]], counts: list[int]) -> list[int]:
        """After drafting: how many of each sequence's drafts to verify. With a table and every
        sequence after tokens per joule, the planner keeps the rows that pay (spec/plan.md)."""
        if self.controller is None or any(s.params.objective != "energy" for s in batch):
            return counts
        table = self.controller.costs.table()
        depths = sequence_depths(table, confidences, prior=table.calibration.by_depth, max_k=self.k,
                                 row_budget=len(counts) * self.k, known_drafts=counts)
        return [min(d, c) for d, c in zip(depths, counts)]

    def eligible_rows(self, batch) -> list[bool]:
        """Which sequences may draft this step. None until the controller has measured plain decode
        (its first few plain steps): every speculative cell is learned as a ratio to it, and one
        measured before it would be read against the prior's plain cost, another machine's maybe."""
        ready = self.enabled and (self.controller is None or self.controller.costs.plain_measured())
        return [ready and self.eligible(s) for s in batch]

    def next_is_plain(self, batch) -> bool:
        """Whether the next step will be plain, so the owner may start it now (lookahead). With the
        controller this is the next step's decision, made once: deciding again a step later flipped
        about one transition in ten, each a cold plain step or a dropped lookahead (a whole forward)."""
        eligible = self.eligible_rows(batch)
        if not any(eligible) or len(batch) > self.mtp_max_seqs:
            return True
        if self.controller is not None:  # the controller decides here, once: the next step runs this plan
            choice = self._controlled(batch, eligible)
            self.planned = (_ids(batch), choice, controller_inputs(self, batch, eligible))
            return choice.step is GateStep.PLAIN
        if self.gate is None:
            return False
        entering = min(s.think.post_think_emitted for s, ok in zip(batch, eligible) if ok)
        return self.gate.next_step() is GateStep.PLAIN and entering + 1 >= self.pin_tokens

    # --- what happened -----------------------------------------------------------------------------
    def record(self, choice: StepChoice, *, wall_s: float, width: int, tokens: int) -> GateDecision | None:
        """The gate's record of a step (whole wall time, whole-batch tokens), where a gate runs."""
        if self.gate is None:
            return None
        self.gate.record(choice.step, wall_s=wall_s, width=width, tokens_emitted=tokens, pinned=choice.pinned)
        return self.gate.take_fresh_decision()

    def note_text(self, seq, delta: str) -> None:
        if self.controller is not None:
            self.controller.note_text(seq, delta)

    def end(self, seq) -> None:
        if self.controller is not None:
            self.controller.end(seq)

    def gauges(self) -> list[tuple[str, float]]:
        """The gate's or the controller's state as telemetry gauges."""
        if self.controller is not None:
            budget = self.controller.budget
            last = self.last.depths if self.last else ()
            return [("planner_depth", float(max(last, default=0))), ("exploration_spent_ms", budget.spent_ms),
                    ("cost_model_observations", float(self.controller.costs.observations))]
        if self.gate is None:
            return []
        snap = self.gate.snapshot()
        out = [("gate_mode_mtp", float(snap["mode"] == "mtp")), ("gate_width_bucket", float(snap["width_bucket"] or 0))]
        for mode in ("serial", "mtp"):
            stats = snap[mode]
            out += [(f"gate_{mode}_tok_s", float(stats["tok_s"] or 0.0)), (f"gate_{mode}_stale", float(stats["stale"]))]
        return out

    def snapshot(self, active=()) -> dict:
        last = self.last
        return {"drafter": self.drafter, "num_draft_tokens": self.k, "gate_setting": self.setting.value,
                "mtp_max_seqs": self.mtp_max_seqs,
                "decider": "controller" if self.controller else ("gate" if self.gate else self.setting.value),
                "last_step": {"step": last.step.value, "depths": list(last.depths), "exploring": last.exploring,
                              "pinned": last.pinned} if last else None,
                "entry_pin_tokens": self.pin_tokens,
                "gate": self.gate.snapshot() if self.gate is not None else None,
                "controller": self.controller.snapshot(active) if self.controller is not None else None}


def _ids(batch) -> tuple[str, ...]:
    return tuple(s.request_id for s in batch)
