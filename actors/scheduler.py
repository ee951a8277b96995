"""Scheduler: owns sequences and forms each step from the scheduler mode.

Receives Admitted, Cancel, Describe (ask: its state) and FailInFlight (fail every request held).
Sends Prefill / Decode / StartAhead / Release / TimeCell to the model owner (and, in hyper mode's trees,
CanBranch / ProposeTree / VerifyTree), Draft to the drafter and VerifyDrafts to the verifier (the
speculative step), TokensEmitted and one terminal event
(Finished, Cancelled or Failed) per request to the streamer, Samples to telemetry.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import assert_never


from actors.scheduler_hyper import HyperPath
from actors.scheduler_learning import ControllerUpkeep
from actors.scheduler_spec import SpecStep
from runtime.actor import Actor
from runtime.gate import GateStep
from runtime.messages import (
    ActorFailure, Admitted, Cancel, Cancelled, Describe, Failed, FailInFlight, Finished, Sample,
    TokensEmitted,
)
from runtime.owner_messages import Decode, Prefill, PrefillChunk, Prefilled, Release
from runtime.controller import Learning
from runtime.decisions import consult
from runtime.modes import SchedulerMode
from runtime.prefill_budget import PrefillBudget
from runtime.energy import open_meter
from runtime.speculation import SpeculationPolicy, StepChoice
from runtime.sequence import Sequence, Status
from runtime.text import IncrementalText, TextCodec


class Scheduler(SpecStep, HyperPath, ControllerUpkeep, Actor):
    name = "scheduler"

    def __init__(self, mode: SchedulerMode, owner: Actor, streamer: Actor, telemetry: Actor,
                 codec: TextCodec, policy: SpeculationPolicy | None = None,
                 drafter: Actor | None = None, verifier: Actor | None = None, watts_per_core: float = 10.0,
                 budget: PrefillBudget | None = None, learning: Learning | None = None, forced_drafts: bool = True):
        super().__init__()  # its inbox bound: Config.actors
        self.mode, self.owner, self.streamer, self.telemetry = mode, owner, streamer, telemetry
        self.codec = codec
        self.policy = policy or SpeculationPolicy("none", 1)
        self.drafter, self.verifier = drafter, verifier
        self.forced_drafts = forced_drafts  # structured output: the grammar's forced tokens as free drafts
        self.waiting: deque[Sequence] = deque()
        self.active: dict[str, Sequence] = {}
        self.steps = 0
        self.prefilling: list[Sequence] = []  # a group part-way through a chunked prefill
        self.prefill_seconds = 0.0  # its chunks so far
        self.budget = budget or PrefillBudget()
        self.meter = open_meter(watts_per_core)  # each step's joules, for the online cost model
        self.learning = learning  # saving the learned table, and the self-calibration (or its check of a prior)
        self.calibration = learning.calibration if learning else None  # runs while idle
        self.persisted_at = time.monotonic()  # when the learned table was last saved
        self.checked_last = False  # the latest turn of the loop ran a check call and nothing arrived in it
        self.ahead = False  # a lookahead plain step is in flight
        self.traces_seen = 0  # the owner's count of compiled graphs traced, as of its latest step reply
        self.step_ended = (0.0, self.meter.read(), ())  # when the latest decode step's forward returned
        self.interleaved = False  # something else (a prefill) ran since it
        self.joining = False  # a sequence takes its first decode step in the step running
        self.consulted = None  # what the latest decision read, for its trace
        self.drafting = (0.0, 0)  # the latest verify's drafting seconds and catch-up, for its trace
        self.hyper_setup()  # hyper mode: the bound run, and the width executor (actors/scheduler_hyper.py)

    # --- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            idle = not self.waiting and not self.active
            items = []
            if idle and self.calibration is not None:  # never blocks a request: one call, then look again
                if (arrived := await self.quiet_or_next()) is None:
                    await self.calibrate_one()
                    idle = False
                else:
                    items = [arrived]
            elif idle:
                items = [await self.inbox.get()]
            if idle and self.mode.batch_wait_s:  # let a burst of arrivals start as one batch
                await asyncio.sleep(self.mode.batch_wait_s)
            while not self.inbox.empty():
                items.append(self.inbox.get_nowait())
            self.checked_last = self.checked_last and not items
            for item in items:
                if self.is_stop(item):
                    return
                await self.dispatch(*item)
            await self.step()

    async def handle(self, msg: Admitted | Cancel | Describe | FailInFlight) -> dict | None:
        match msg:
            case Admitted():
                text = IncrementalText(self.codec, msg.params.stop)
                self.waiting.append(Sequence(msg.request_id, msg.prompt_ids, msg.params, text, msg.submitted_at,
                                             constraint=self.constraint(msg.params.grammar)))
                self.mode.note_admitted(self.waiting[-1])
            case Cancel():
                await self.cancel(msg.request_id, msg.reason)
            case Describe():
                return self.describe()
            case FailInFlight():
                failure = ActorFailure("system", msg.error, msg.status)
                for seq in [*self.waiting, *self.active.values()]:
                    if not msg.request_ids or seq.request_id in msg.request_ids:
                        await self.fail(seq, failure)
            case _:
                assert_never(msg)

    async def step(self) -> None:
        if self.mode.name == "hyper":  # runs bound through the hyper gate, serial's steps inside
            return await self.hyper_step()
        if self.mode.chunked_prefill:
            await self.prefill_chunk()
        else:
            for seq in self.mode.admit(self.waiting, self.active):
                await self.prefill(seq)
        if batch := self.mode.decode_batch(self.active):
            await self.decode_step(batch)

    async def decode_step(self, batch: list[Sequence]) -> None:
        """One plain or speculative step of the batch (a width executor may widen the latter)."""
        self.steps += 1
        self.costs_of_last_step(batch)
        self.joining = any(s.spec.plain_steps + s.spec.verify_steps == 0 for s in batch)  # a transition
        depth = max(len(s.prompt_ids) + len(s.output_ids) for s in batch)
        choice = self.policy.choose(batch, depth, ahead=self.ahead)
        self.consulted = consult(self.policy, batch, choice, depth)
        if choice.step is GateStep.MTP:
            if self.widening is None or not await self.widening.widen(batch, choice):
                await self.spec_step(batch, choice)
        elif not choice.ahead and (forced := self.forced_plain(batch)) is not None:
            await self.forced_step(batch, forced)
        else:
            await self.plain_step(batch, chosen=choice.eligible > 0)

    def constraint(self, grammar: str | None):
        """The scheduler's matcher of a structured-output request (it cuts forbidden drafts)."""
        if grammar is None:
            return None
        from runtime.grammar import Constraint, grammar_tokenizer

        return Constraint(grammar, grammar_tokenizer(self.codec.tok, tuple(sorted(self.codec.eos_ids))))

    def describe(self) -> dict:
        return {"self_calibration": self.calibration.snapshot() if self.calibration else None,
                "mode": self.mode.name, "steps": self.steps, "waiting": len(self.waiting),
                "active": len(self.active), "speculation": self.policy.snapshot(self.mode.decode_batch(self.active)),
                "prefill_budget": self.budget.snapshot(), **self.mode.describe()}

    # --- work ------------------------------------------------------------------------------------
    async def prefill(self, seq: Sequence) -> None:
        """Prefill one sequence whole and emit its first token (serial)."""
        self._start(seq)
        self.interleaved = True
        command = Prefill(seq_id=seq.request_id, prompt_ids=seq.prompt_ids, params=seq.params,
                          lookahead=self.mode.lookahead and seq.params.max_tokens > 1)
        try:
            reply = await self.owner.ask(command)
        except ActorFailure as e:
            return await self.fail(seq, e)
        await self.prefilled(seq, reply, reply.seconds, together=1)

    async def prefill_chunk(self) -> None:
        """Start a group of newcomers, or go on with the one in flight: one chunk per step, sized by
        the budget while others decode (their next token waits for it), unbounded while none do."""
        items = ()
        if not self.prefilling:
            self.prefilling, self.prefill_seconds = self.mode.admit(self.waiting, self.active), 0.0
            for seq in self.prefilling:
                self._start(seq)
            items = tuple(Prefill(seq_id=s.request_id, prompt_ids=s.prompt_ids, params=s.params, lookahead=False)
                          for s in self.prefilling)
        if not self.prefilling:
            return
        group, self.interleaved = self.prefilling, True
        budget = self.budget.tokens() if self.mode.decode_batch(self.active) else 0
        try:
            progress = await self.owner.ask(PrefillChunk(items=items, budget=budget))
        except ActorFailure as e:
            self.prefilling = []
            for seq in group:
                await self.fail(seq, e)
            return
        self.budget.note_prefill(progress.tokens, progress.seconds)
        self.prefill_seconds += progress.seconds
        if not progress.prefilled:
            return
        replies = {p.seq_id: p for p in progress.prefilled}
        # Prompt-cache hits come back at once; the rest of the group goes on at the next step
        self.prefilling = [seq for seq in group if seq.request_id not in replies]
        for seq in group:
            if seq.request_id in replies and seq.status is Status.PREFILLING:  # not cancelled meanwhile
                await self.prefilled(seq, replies[seq.request_id], self.prefill_seconds, together=len(group))

    def _start(self, seq: Sequence) -> None:
        seq.move(Status.PREFILLING)
        self.active[seq.request_id] = seq

    async def prefilled(self, seq: Sequence, reply: Prefilled, seconds: float, together: int) -> None:
        seq.move(Status.DECODING)
        seq.cached_tokens = reply.cached_tokens
        self.log.info("prefilled", request_id=seq.request_id, prompt_tokens=len(seq.prompt_ids),
                      cached_tokens=reply.cached_tokens,
                      seconds=round(seconds, 4), together=together,
                      queued_seconds=round(time.monotonic() - seq.submitted_at, 4))
        await self.telemetry.tell(Sample(name="prefill_seconds", value=seconds, kind="observe"))
        await self.observe("request_queue_time_seconds", time.monotonic() - seq.submitted_at - seconds)
        await self.emit(seq, [reply.token], reply.logprobs)

    async def plain_step(self, batch: list[Sequence], chosen: bool = False) -> None:
        ids = tuple(s.request_id for s in batch)
        ahead = self.may_look_ahead(batch)
        self.ahead = ahead  # the next step is computing already: it will not explore
        started, energy = time.perf_counter(), self.meter.read()
        try:
            reply = await self.owner.ask(Decode(seq_ids=ids, lookahead=tuple(ahead and s.remaining > 1 for s in batch)))
        except ActorFailure as e:
            for seq in batch:
                await self.fail(seq, e)
            return
        wall, spent = time.perf_counter() - started, self.meter.read()  # one reading: each is a syscall
        joules, self.step_ended = spent.since(energy), (started + wall, spent, ids)
        if (controller := self.policy.controller) is not None:
            controller.record_plain(len(batch), wall * 1e3, joules, chosen, traced=self.traced(reply.traces),
                                    joining=self.joining)
        for i, (seq, token) in enumerate(zip(batch, reply.tokens)):
            seq.spec.plain_steps += 1
            seq.spec.plain_seconds += wall
            await self.emit(seq, [token], reply.logprobs[i] if reply.logprobs else ())
        self.mode.note_step("plain", len(batch), 0, 0)
        await self.after_step(StepChoice(GateStep.PLAIN, (0,) * len(batch)), wall, batch, len(batch), joules)

    def traced(self, count: int) -> bool:
        """Whether the owner traced a compiled graph (a shape's first use) since its latest step reply:
        this step, or the lookahead before it, paid a one-time cost, not its shape's."""
        seen, self.traces_seen = self.traces_seen, max(self.traces_seen, count)
        return count > seen

    async def after_step(self, choice: StepChoice, wall: float, batch, tokens: int, joules: float | None = None,
                         outcomes: tuple = ()) -> None:
        self.budget.note_step(wall)
        await self.trace_step(choice, wall, batch, tokens, joules, outcomes)  # before the gate records it
        phase = "step_mtp" if choice.step is GateStep.MTP else "step_plain"
        await self.telemetry.tell(Sample(name="sched_phase_seconds", value=wall, kind="observe",
                                         labels=(("phase", phase),)))
        decision = self.policy.record(choice, wall_s=wall, width=len(batch), tokens=tokens)
        self.log.debug("step", step=self.steps, phase=phase, pinned=choice.pinned, exploring=choice.exploring,
                       depths=choice.depths, width=len(batch), tokens=tokens, seconds=round(wall, 5),
                       request_id=batch[0].request_id if len(batch) == 1 else None)
        await self.after_control(batch)
        for name, value in self.policy.gauges():
            await self.telemetry.tell(Sample(name=name, value=value, kind="gauge"))
        if decision is not None:
            self.log.info("gate_switched", step=self.steps, mode=decision.mode.value,
                          serial_tok_s=decision.serial_tok_s, mtp_tok_s=decision.mtp_tok_s,
                          width_bucket=decision.width_bucket)
            await self.telemetry.tell(Sample(name="gate_switches_total", value=1,
                                             labels=(("to", decision.mode.value),)))

    async def emit(self, seq: Sequence, token_ids: list[int], logprobs: tuple = ()) -> None:
        index = len(seq.output_ids)
        first = seq.first_token_at is None
        kept, delta = seq.accept(token_ids, self.codec.eos_ids)
        logprobs = tuple(logprobs[:len(kept)])
        if seq.constraint is not None:
            seq.constraint.advance(kept)
        seq.think = seq.think.advance(kept, self.policy.think_markers)
        seq.content.advance(delta)
        self.policy.note_text(seq, delta)
        if first and kept:
            self.log.info("first_token", request_id=seq.request_id, step=self.steps,
                          seconds=round(seq.first_token_at - seq.submitted_at, 4))
            await self.observe("time_to_first_token_seconds", seq.first_token_at - seq.submitted_at)
        if kept or delta:
            await self.streamer.tell(TokensEmitted(request_id=seq.request_id, token_ids=tuple(kept),
                                                   text=delta, index=index, logprobs=logprobs))
        if seq.done:
            await self.finish(seq)

    # --- endings: exactly one terminal event per request -----------------------------------------
    async def finish(self, seq: Sequence) -> None:
        seq.move(Status.FINISHED)
        await self._leave(seq)
        self.log.info("finished", request_id=seq.request_id, step=self.steps, reason=seq.finish_reason,
                      completion_tokens=len(seq.output_ids),
                      seconds=round(time.monotonic() - seq.submitted_at, 4))
        await self.observe("e2e_request_latency_seconds", time.monotonic() - seq.submitted_at)
        await self.streamer.tell(Finished(request_id=seq.request_id, finish_reason=seq.finish_reason,
                                          usage=seq.usage(), stop=seq.text.stop_hit))

    async def cancel(self, request_id: str, reason: str) -> None:
        seq = self.active.get(request_id) or next((s for s in self.waiting if s.request_id == request_id), None)
        if seq is None or seq.status.terminal:
            return
        seq.move(Status.CANCELLED)
        await self._leave(seq)
        self.log.info("cancelled", request_id=request_id, step=self.steps, reason=reason,
                      completion_tokens=len(seq.output_ids))
        await self.streamer.tell(Cancelled(request_id=request_id, reason=reason, usage=seq.usage()))

    async def fail(self, seq: Sequence, error: ActorFailure) -> None:
        if seq.status.terminal:
            return
        seq.move(Status.FAILED)
        await self._leave(seq)
        self.log.error("failed", request_id=seq.request_id, step=self.steps, error=str(error))
        await self.streamer.tell(Failed(request_id=seq.request_id, error=error.message, status=error.status))

    async def _leave(self, seq: Sequence) -> None:
        self.policy.end(seq)
        self.mode.note_left(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        if self.active.pop(seq.request_id, None) is not None and not self.owner.closing:
            await self.owner.tell(Release(seq_id=seq.request_id, tokens=seq.kept_tokens()))

    async def teardown(self) -> None:
        for seq in [*self.waiting, *self.active.values()]:
            await self.cancel(seq.request_id, "shutdown")
        self.persist()
