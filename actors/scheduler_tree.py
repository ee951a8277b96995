"""Hyper mode's width executor: draft trees from one request (spec/hyper.md's width seam, used).

Part of the scheduler actor (it runs inside the scheduler's task and uses its peers). run_cohort
runs the serial closure and, while it runs, widens each speculative step the controller chose: the
drafter gives the spine (the chain the serial step would verify) and alternatives (the MTP head's
next candidates at each depth, and n-gram continuations found earlier in the text); the tree planner
(runtime/tree_plan.py) keeps the alternatives that pay by this machine's measured verify costs and
the measured hit rate of alternatives; the owner verifies the tree in one forward, walks it and keeps
the longest accepted path (kernels/tree_verify.py). With no alternative kept, the spine is verified
as the serial step verifies a chain (the same code, the same records); a tree step is recorded for
the controller as the step it was (its cost and accepted count at its depth). Width w counts the
branches: the real chain and w - 1 rows the request generated itself.
"""

from __future__ import annotations

import time

from kernels.ngram_tree import propose_ngram_branches
from kernels.tree import trie
from runtime.hyper import HyperCohortPlan, HyperRequestMeta
from runtime.messages import ActorFailure, Sample
from runtime.owner_messages import Drafted, ProposeTree, VerifyTree
from runtime.plan import expected_tokens
from runtime.tree_plan import Candidate, TreePlanner


class TreeExecutor:
    def __init__(self, scheduler, max_width: int):
        self.scheduler, self.planner = scheduler, TreePlanner(max_width)
        self.caught_up = 0  # tokens the latest spine's draft first caught up on
        self.support = None  # the owner's Branching, asked before the first run

    # --- the width seam ----------------------------------------------------------------------------
    def plan(self, meta: HyperRequestMeta) -> HyperCohortPlan:
        why = self.singleton_reason(meta)
        return HyperCohortPlan(width=1, reason=why) if why else \
            HyperCohortPlan(width=self.planner.max_width, reason="tree_by_measurement")

    def singleton_reason(self, meta: HyperRequestMeta) -> str | None:
        """Why this request runs at width 1 throughout; None where its steps may widen."""
        policy = self.scheduler.policy
        if self.planner.max_width < 2:
            return "max_width_1"
        if meta.generation_mode != "mtp":
            return "plain_decode_request"
        if policy.drafter not in ("mtp", "ngram"):
            return "drafter_drafts_chains_only"
        if policy.controller is None:
            return "no_cost_model"  # the width is chosen from measured costs; none are kept
        if not (self.support and self.support.ok):
            return "model_cannot_branch"
        return None

    def run_cohort(self, plan: HyperCohortPlan, singleton):
        return self._widened(singleton)

    async def _widened(self, singleton):
        run = singleton()
        self.scheduler.widening = self
        try:
            async for step in run:
                yield step
        finally:
            self.scheduler.widening = None
            await run.aclose()

    # --- one step ----------------------------------------------------------------------------------
    async def widen(self, batch, choice) -> bool:
        """Run this speculative step with a tree (or its spine alone); False leaves it to the serial
        step (a step it cannot draft for)."""
        s, seq = self.scheduler, batch[0]
        k = min(choice.depths[0], seq.remaining - 1)
        if len(batch) != 1 or k < 1 or not s.policy.eligible(seq) or seq.params.processed:
            return False  # penalties and log-probabilities: the serial step's chain verify has them
        started, energy = time.perf_counter(), s.meter.read()
        try:
            spine, confidences, candidates = await self.draft(seq, k)
        except ActorFailure as e:
            await s.fail(seq, e)
            return True
        if not spine:  # nothing to propose: this step decodes plainly, as the serial step would
            await s.plain_step(batch)
            return True
        drafted = (time.perf_counter(), s.meter.read())
        table = s.policy.controller.costs.table()
        accept = self.planner.spine_acceptance(seq.request_id, len(spine), table.calibration.by_depth)
        kept = self.planner.choose(table, accept, expected_tokens(accept), (drafted[0] - started) * 1e3, candidates)
        if kept:
            await self.verify_tree(batch, choice, spine, confidences, kept, (started, energy), drafted, table)
            return True
        chain = s.allot(batch, [Drafted(tokens=spine, confidences=confidences, has_probs=False,
                                        seconds=drafted[0] - started, caught_up=self.caught_up)])
        verified = await s.verify_drafts(batch, choice, chain, started, energy)
        if verified is not None:
            verify_ms, ((n, accepted),) = verified
            self.planner.note_verify(table, n, 0, verify_ms)
            self.planner.note_spine(seq.request_id, n, accepted)
        s.mode.gate.set_live_width(1)
        return True

    async def draft(self, seq, k: int) -> tuple[tuple[int, ...], tuple[float, ...], list[Candidate]]:
        """The spine, its confidences, and the candidates: the head's at every depth and prompt
        lookup's continuations (n-gram drafter: its first continuation is the spine)."""
        s = self.scheduler
        top = self.planner.max_width - 1
        history = seq.prompt_ids + tuple(seq.output_ids)
        self.caught_up = 0
        if s.policy.drafter == "ngram":
            lookup = propose_ngram_branches(history, k, width=top + 1)
            if not lookup:
                return (), (), []
            spine, confidences, candidates, lookup = tuple(lookup[0]), (), [], lookup[1:]
        else:
            drafted = await s.owner.ask(ProposeTree(seq_id=seq.request_id, k=k, top=top))
            spine, confidences, self.caught_up = drafted.tokens, drafted.confidences, drafted.caught_up
            candidates = [Candidate(depth=j, tokens=(token,), prob=prob)
                          for j, alternatives in enumerate(drafted.alternatives, start=1) for token, prob in alternatives]
            lookup = propose_ngram_branches(history, k, width=top)
        candidates += [Candidate(depth=r, tokens=tuple(b), nodes=len(b) - _shared(spine, b))
                       for r, b in enumerate(lookup, start=1) if len(b) > _shared(spine, b)]
        return spine, confidences, candidates

    async def verify_tree(self, batch, choice, spine, confidences, kept, started, drafted, table) -> None:
        s, seq = self.scheduler, batch[0]
        tree, grew = trie([list(spine)] + [c.branch(spine) for c in kept])
        kept = [kept[i - 1] for i in grew[1:]]  # one repeating another's path adds nothing: dropped
        try:
            got = await s.owner.ask(VerifyTree(seq_id=seq.request_id, tokens=tree.tokens, parents=tree.parents,
                                               leaves=tree.leaves))
        except ActorFailure as e:
            await s.fail(seq, e)
            return
        ended, energy = time.perf_counter(), s.meter.read()
        s.step_ended = (ended, energy, (seq.request_id,))
        wall, depth = ended - started[0], max(tree.depths())
        self.planner.note_verify(table, len(spine), tree.size - len(spine), (ended - drafted[0]) * 1e3)
        self.note_outcome(seq, spine, kept, got)
        # The controller is told the step as run (the tree's cost and outcome at its depth), so the
        # depth it chooses is the tree's; the spine's own record stays with the planner.
        s.policy.controller.record_spec(choice, batch, verify_depth=depth, verify_ms=(ended - drafted[0]) * 1e3,
                                        verify_j=energy.since(drafted[1]), draft_width=1,
                                        draft_ms=(drafted[0] - started[0]) * 1e3,
                                        draft_j=drafted[1].since(started[1]), tokens=len(got.emitted),
                                        caught_up=self.caught_up)
        s.policy.controller.record_outcome(seq, depth, got.accepted)
        s.drafting = (drafted[0] - started[0], self.caught_up)  # for the step's trace
        seq.spec.note_verify(depth, got.accepted, wall, confidences)
        gate = s.mode.gate
        gate.set_live_width(tree.width)
        gate.record_fork(rows_launched=tree.width - 1, rows_committed=int(got.branch > 0 and got.accepted > 0))
        s.run_width = max(s.run_width, tree.width)
        await s.telemetry.tell(Sample(name="drafted_tokens_total", value=tree.size,
                                      labels=(("drafter", s.policy.drafter),)))
        await s.telemetry.tell(Sample(name="accepted_tokens_total", value=got.accepted))
        await s.emit(seq, list(got.emitted))
        s.mode.note_step("tree", 1, tree.size, got.accepted)
        await s.after_step(choice, wall, batch, len(got.emitted), energy.since(started[1]), ((depth, got.accepted),))

    def note_outcome(self, seq, spine, kept, got) -> None:
        """The planner learns the alternatives' hits and each one's extra tokens over the spine, and
        the spine's own outcome (what the chain alone would have had accepted)."""
        spine_accepted = got.branch_accepted[0]
        won = kept[got.branch - 1] if got.branch else None
        extra = {c.depth: max(0, got.branch_accepted[i + 1] - spine_accepted) for i, c in enumerate(kept)
                 if c.prob is None and i + 1 < len(got.branch_accepted)}
        self.planner.note_outcome(kept, spine_accepted, won, extra)
        self.planner.note_spine(seq.request_id, len(spine), spine_accepted)

    def snapshot(self) -> dict:
        support = self.support
        return {**self.planner.snapshot(), "branching": None if support is None else
                {"ok": support.ok, "reason": support.reason}}


def _shared(spine, branch) -> int:
    n = 0
    while n < min(len(spine), len(branch)) and spine[n] == branch[n]:
        n += 1
    return n
