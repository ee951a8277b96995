"""The scheduler's speculative step: draft for every eligible sequence, keep the planner's share,
verify all rows in one target forward, roll each back. Part of the scheduler actor (its own file to
keep each under ~300 lines): it asks the drafter and the verifier, and hands the controller each
step's draft and verify costs (wall ms, joules) and every sequence's outcome.
"""

from __future__ import annotations

import time

import msgspec

from runtime.decisions import step_trace
from runtime.messages import ActorFailure, Sample
from runtime.owner_messages import Draft, Drafted, DraftMany, StartAhead, VerifyBatch, VerifyDrafts
from runtime.gate import GateStep
from runtime.sequence import Sequence
from runtime.speculation import StepChoice

FORCED_MAX = 8  # forced tokens one plain-step forward takes (the cost tables' deepest verify)


class SpecStep:
    async def spec_step(self, batch: list[Sequence], choice: StepChoice) -> None:
        """Draft for every eligible sequence, verify all rows in one target forward, roll each back."""
        started, energy = time.perf_counter(), self.meter.read()
        self.ahead = False  # drafting drops any lookahead step
        try:
            drafts = self.allot(batch, await self.draft_all(batch, choice.depths))
        except ActorFailure as e:
            for seq in batch:
                await self.fail(seq, e)
            return
        await self.verify_drafts(batch, choice, drafts, started, energy)

    async def verify_drafts(self, batch: list[Sequence], choice: StepChoice, drafts: list[Drafted | None],
                            started: float, energy) -> tuple[float, tuple] | None:
        """Verify the step's drafts in one target forward, roll each back, record the step's costs and
        outcomes; the verify ms and (drafted, accepted) per row (None where nothing was verified)."""
        if not any(drafts):  # nothing to propose: this step decodes plainly
            await self.plain_step(batch)
            return None
        try:
            drafted_at, drafted_energy = time.perf_counter(), self.meter.read()
            rows = tuple(VerifyDrafts(seq_id=s.request_id, drafts=d.tokens if d else (),
                                      use_draft_probs=bool(d and d.has_probs)) for s, d in zip(batch, drafts))
            if len(rows) == 1:
                results = (await self.verifier.ask(rows[0]),)
                traces = results[0].traces
            else:
                verified = await self.verifier.ask(VerifyBatch(rows=rows))
                results, traces = verified.results, verified.traces
        except ActorFailure as e:
            for seq in batch:
                await self.fail(seq, e)
            return None
        wall, spent = time.perf_counter() - started, self.meter.read()  # one reading: each is a syscall
        joules, self.step_ended = spent.since(energy), (started + wall, spent, tuple(s.request_id for s in batch))
        tokens = sum(len(r.emitted) for r in results)
        caught_up = max((d.caught_up for d in drafts if d and not d.forced), default=0)
        self.drafting = (drafted_at - started, caught_up)  # for the step's trace
        if (controller := self.policy.controller) is not None:
            controller.record_spec(choice, batch, verify_depth=max(len(r.drafts) for r in rows),
                                   verify_ms=(started + wall - drafted_at) * 1e3,
                                   verify_j=spent.since(drafted_energy),
                                   draft_width=sum(1 for d in drafts if d and not d.forced),
                                   draft_ms=(drafted_at - started) * 1e3,
                                   draft_j=drafted_energy.since(energy), tokens=tokens, caught_up=caught_up,
                                   traced=self.traced(traces), joining=self.joining)
        for seq, row, drafted, result in zip(batch, rows, drafts, results):
            if row.drafts and drafted.forced:
                seq.spec.note_forced(len(row.drafts), wall)
            elif row.drafts:
                seq.spec.note_verify(len(row.drafts), result.accepted, wall, drafted.confidences)
                if controller is not None:
                    controller.record_outcome(seq, len(row.drafts), result.accepted)
            else:
                seq.spec.plain_steps += 1
                seq.spec.plain_seconds += wall
        await self.start_ahead(batch, results)  # once the outcomes are in: they decide the next step
        for seq, result in zip(batch, results):
            await self.emit(seq, list(result.emitted), result.logprobs)
        self.mode.note_step("mtp", len(batch), sum(len(r.drafts) for r in rows), sum(r.accepted for r in results))
        outcomes = tuple((len(row.drafts), result.accepted) for row, result in zip(rows, results))
        await self.after_step(choice, wall, batch, tokens, joules, outcomes)
        return (started + wall - drafted_at) * 1e3, outcomes

    async def start_ahead(self, batch: list[Sequence], results) -> None:
        """Where the next step will likely be plain, start it now (the rollbacks are queued at the owner
        before it), as a plain step's lookahead would: no plain step after a verify starts cold."""
        going = tuple(s.request_id for s, r in zip(batch, results) if s.remaining - len(r.emitted) >= 1)
        self.ahead = bool(going) and self.may_look_ahead(batch)
        if self.ahead:
            await self.owner.tell(StartAhead(seq_ids=going))
            if self.policy.controller is not None:
                self.policy.controller.ahead_started()

    def may_look_ahead(self, batch: list[Sequence]) -> bool:
        """Whether to start the next plain step now: it will likely be one, nobody waits or prefills to
        join (a group that joins makes the owner drop it), and no row is structured output (its
        grammar's next mask needs this step's token: the owner starts none, kernels/processing.py)."""
        return self.mode.lookahead and not self.waiting and not self.prefilling and \
            self.policy.next_is_plain(batch) and all(s.constraint is None for s in batch)

    async def trace_step(self, ran: StepChoice, wall: float, batch, tokens: int, joules, outcomes) -> None:
        """The step's decision, with what it read and what it measured, to telemetry's ring."""
        (draft_s, caught_up), self.drafting = self.drafting if outcomes else (0.0, 0), (0.0, 0)
        if self.consulted is not None:
            await self.telemetry.tell(step_trace(self.consulted, ran, step=self.steps, drafter=self.policy.drafter,
                                                 width=len(batch), active=len(self.active), waiting=len(self.waiting),
                                                 wall_s=wall, joules=joules, tokens=tokens, outcomes=outcomes,
                                                 draft_s=draft_s, caught_up=caught_up))

    async def observe(self, name: str, seconds: float) -> None:
        await self.telemetry.tell(Sample(name=name, value=max(0.0, seconds), kind="observe"))

    def allot(self, batch, drafts: list[Drafted | None]) -> list[Drafted | None]:
        """Keep the planner's share of each sequence's drafts (a prefix; None where it is zero)."""
        counts = [len(d.tokens) if d else 0 for d in drafts]
        keep = self.policy.allot(batch, [d.confidences if d else () for d in drafts], counts)
        keep = [len(d.tokens) if d and d.forced else n for d, n in zip(drafts, keep)]  # forced: free, all kept
        # Structured output: drafts the grammar forbids are cut here, never verified.
        keep = [seq.constraint.allowed_prefix(d.tokens[:n]) if d and n and seq.constraint is not None else n
                for seq, d, n in zip(batch, drafts, keep)]
        return [msgspec.structs.replace(d, tokens=d.tokens[:n], confidences=d.confidences[:n]) if d and n else None
                for d, n in zip(drafts, keep)]

    async def draft_all(self, batch: list[Sequence], depths: tuple[int, ...]) -> list[Drafted | None]:
        """Drafts for every sequence of the step (one ask for the batch); None where one does not
        speculate this step."""
        wanted = [(i, self.draft_request(seq, depth)) for i, (seq, depth) in enumerate(zip(batch, depths))]
        drafts: list[Drafted | None] = [self.forced(batch[i], d.k) if d is not None else None for i, d in wanted]
        wanted = [(i, d) for i, d in wanted if d is not None and drafts[i] is None]
        if not wanted:
            return drafts
        replies = (await self.drafter.ask(wanted[0][1]),) if len(wanted) == 1 else \
            await self.drafter.ask(DraftMany(items=tuple(d for _, d in wanted)))
        for (i, _), drafted in zip(wanted, replies):
            drafts[i] = drafted if drafted.tokens else None
        return drafts

    async def forced_step(self, batch: list[Sequence], forced: Drafted) -> None:
        """A plain step of one sequence whose grammar forces its next tokens: they are verified as
        free drafts, all accepted, so one forward emits them all. Not speculation: no drafter ran, and
        the gate and the acceptance estimates never see it; the verify cell learns its cost."""
        started, energy = time.perf_counter(), self.meter.read()
        self.ahead = False
        choice = StepChoice(GateStep.MTP, (len(forced.tokens),), pinned=True)
        await self.verify_drafts(batch, choice, [forced], started, energy)

    def forced_plain(self, batch: list[Sequence]) -> Drafted | None:
        """The forced tokens a plain step of this one sequence can take at once (None: none, or a
        batch, where one row's drafts would widen every row's verify)."""
        if len(batch) != 1:
            return None
        return self.forced(batch[0], min(FORCED_MAX, batch[0].remaining - 1))

    def forced(self, seq: Sequence, k: int) -> Drafted | None:
        """Structured output: the tokens the grammar forces next as this step's drafts, where any."""
        if not self.forced_drafts or seq.constraint is None:
            return None
        tokens = tuple(seq.constraint.forced()[:k]) if k > 0 else ()
        return Drafted(tokens=tokens, confidences=(), has_probs=False, seconds=0.0, forced=True) if tokens else None

    def draft_request(self, seq: Sequence, depth: int) -> Draft | None:
        k = min(depth, seq.remaining - 1)
        if k < 1 or not self.policy.eligible(seq):
            return None
        history = seq.prompt_ids + tuple(seq.output_ids) if self.policy.drafter == "ngram" else ()
        return Draft(seq_id=seq.request_id, history=history, k=k)

