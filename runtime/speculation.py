"""Per step, plain decode or the speculative step: the MTP gate, its setting, eligibility, entry pin.

Pure policy (no asyncio, no MLX, no clock): the scheduler passes measured wall times in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from runtime.eligibility import (
    GateSetting, ThinkMarkers, entry_pin_forces_verify, entry_pin_tokens_from_env, gate_setting,
    spec_dispatch_eligible, spec_think_from_env,
)
from runtime.cost_table import CostTable
from runtime.gate import GateDecision, GateStep, MtpGate
from runtime.plan import propose_depth, sequence_depths


class SpeculationPolicy:
    def __init__(self, drafter: str, k: int, gate_cli: str | None = None, resume_guard: int = 0,
                 think_markers: ThinkMarkers = ThinkMarkers(), env: Mapping[str, str] = os.environ,
                 mtp_max_seqs: int = 32, table: CostTable | None = None, slack: float = 0.1):
        self.drafter, self.k, self.mtp_max_seqs = drafter, k, mtp_max_seqs
        self.table, self.slack = table, slack  # the measured planner (spec/plan.md), when a table exists
        self.last_depth: tuple[int, str] = (k, "configured")
        self._choices: dict = {}  # width -> the planner's DepthChoice
        self.setting = GateSetting.OFF if drafter == "none" else gate_setting(gate_cli, env)
        self.gate = MtpGate() if self.setting is GateSetting.AUTO else None
        self.pin_tokens = entry_pin_tokens_from_env(env)
        self.spec_think = spec_think_from_env(env)
        self.resume_guard, self.think_markers = resume_guard, think_markers

    @property
    def enabled(self) -> bool:
        return self.setting is not GateSetting.OFF

    def eligible(self, seq) -> bool:
        # Under the measuring gate the step path depends on timing, and rejection sampling draws
        # differ by path: a seeded sampled request decodes plainly so its seed reproduces its output.
        if self.gate is not None and seq.params.seed is not None and not seq.params.greedy:
            return False
        return spec_dispatch_eligible(seq.think, resume_guard=self.resume_guard, spec_think=self.spec_think,
                                      disable_mtp=seq.params.disable_mtp)

    def choose(self, batch, context_depth: int) -> tuple[GateStep, bool]:
        """The step to run for this batch, and whether it runs under the entry pin (not recorded).
        Sequences that are not eligible take plain rows inside a speculative step."""
        eligible = [s for s in batch if self.eligible(s)]
        if self._always_plain(batch, eligible):
            return GateStep.PLAIN, False
        if self.gate is None:
            return GateStep.MTP, False
        self.gate.note_width(len(batch))
        self.gate.maybe_remeasure(context_depth)
        step = self.gate.next_step()
        pinned = entry_pin_forces_verify(step, min_post_think_emitted=min(s.think.post_think_emitted for s in eligible),
                                         pin_tokens=self.pin_tokens)
        return (GateStep.MTP, True) if pinned else (step, False)

    def depth(self, width: int) -> int:
        """Drafts to propose per sequence this step: the planner's K, or the configured one."""
        if self.table is None:
            return self.k
        choice = self._choices.get(width)
        if choice is None:  # the table and prior are fixed: one choice per width
            choice = self._choices[width] = propose_depth(
                width, table=self.table, prior=self.table.calibration.by_depth, max_k=self.k,
                slack=self.slack, mtp_max_seqs=self.mtp_max_seqs)
        self.last_depth = (choice.depth, choice.reason)
        return choice.depth

    def _always_plain(self, batch, eligible) -> bool:
        """Speculation off, nobody eligible, over the mtp_max_seqs cap, or the measured planner says
        no draft pays at this width (then pin and probes aside: such a step would only cost)."""
        return (not self.enabled or not eligible or len(batch) > self.mtp_max_seqs
                or (self.table is not None and self.depth(len(batch)) < 1))

    def allot(self, confidences: list[tuple[float, ...]], counts: list[int]) -> list[int]:
        """After drafting: how many of each sequence's drafts to verify (all, without a table)."""
        if self.table is None:
            return counts
        depths = sequence_depths(self.table, confidences, prior=self.table.calibration.by_depth, max_k=self.k,
                                 row_budget=len(counts) * self.k, known_drafts=counts)
        return [min(d, c) for d, c in zip(depths, counts)]

    def next_is_plain(self, batch) -> bool:
        """A guess for lookahead: a wrong one costs one dropped step, never a wrong token."""
        eligible = [s for s in batch if self.eligible(s)]
        if self._always_plain(batch, eligible):
            return True
        if self.gate is None:
            return False
        return self.gate.next_step() is GateStep.PLAIN and \
            min(s.think.post_think_emitted for s in eligible) + 1 >= self.pin_tokens

    def record(self, step: GateStep, *, pinned: bool, wall_s: float, width: int,
               tokens: int) -> GateDecision | None:
        if self.gate is None:
            return None
        self.gate.record(step, wall_s=wall_s, width=width, tokens_emitted=tokens, pinned=pinned)
        return self.gate.take_fresh_decision()

    def gauges(self) -> list[tuple[str, float]]:
        """The gate's state as telemetry gauges: mode, both estimates, staleness, width bucket."""
        if self.gate is None:
            return []
        snap = self.gate.snapshot()
        out = [("gate_mode_mtp", float(snap["mode"] == "mtp")), ("gate_width_bucket", float(snap["width_bucket"] or 0))]
        for mode in ("serial", "mtp"):
            stats = snap[mode]
            out += [(f"gate_{mode}_tok_s", float(stats["tok_s"] or 0.0)), (f"gate_{mode}_stale", float(stats["stale"]))]
        return out

    def snapshot(self) -> dict:
        return {"drafter": self.drafter, "num_draft_tokens": self.k, "gate_setting": self.setting.value,
                "mtp_max_seqs": self.mtp_max_seqs, "cost_model": "measured" if self.table else "off",
                "planner_depth": {"depth": self.last_depth[0], "reason": self.last_depth[1]},
                "entry_pin_tokens": self.pin_tokens,
                "gate": self.gate.snapshot() if self.gate is not None else None}
