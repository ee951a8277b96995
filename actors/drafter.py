"""Drafter: proposes up to K draft tokens for a sequence, with their confidences.

Receives Draft (ask: replies Drafted) and DraftMany (ask: replies one Drafted per item, for a batch
step). N-gram prompt lookup runs here (pure Python, no weights); the MTP head and the draft model
run on the model owner, asked with Propose / ProposeMany (one owner job for a whole batch). Drafted
is empty when there is nothing to propose (no n-gram match, or speculation off).
"""

from __future__ import annotations

import time
from typing import assert_never

from kernels.ngram import propose_ngram
from runtime.actor import Actor
from runtime.messages import Sample
from runtime.owner_messages import Draft, Drafted, DraftMany, Propose, ProposeMany


class Drafter(Actor):
    name = "drafter"

    def __init__(self, kind: str, owner: Actor, telemetry: Actor, ngram_max: int = 3):
        super().__init__()  # its inbox bound: Config.actors
        self.kind, self.owner, self.telemetry, self.ngram_max = kind, owner, telemetry, ngram_max

    async def handle(self, msg: Draft | DraftMany) -> Drafted | tuple[Drafted, ...]:
        match msg:
            case Draft():
                drafted = await self.draft(msg)
                count = len(drafted.tokens)
            case DraftMany():
                drafted = await self.draft_many(msg)
                count = sum(len(d.tokens) for d in drafted)
            case _:
                assert_never(msg)
        await self.telemetry.tell(Sample(name="drafted_tokens_total", value=count, labels=(("drafter", self.kind),)))
        return drafted

    async def draft_many(self, msg: DraftMany) -> tuple[Drafted, ...]:
        if self.kind in ("mtp", "draft-model"):
            return await self.owner.ask(ProposeMany(items=tuple(Propose(seq_id=d.seq_id, k=d.k) for d in msg.items)))
        return tuple([await self.draft(d) for d in msg.items])

    async def draft(self, msg: Draft) -> Drafted:
        if self.kind == "ngram":
            started = time.perf_counter()
            tokens = propose_ngram(msg.history, msg.k, max_n=self.ngram_max)
            return Drafted(tokens=tuple(tokens), confidences=(), has_probs=False,
                           seconds=time.perf_counter() - started)
        if self.kind in ("mtp", "draft-model"):
            return await self.owner.ask(Propose(seq_id=msg.seq_id, k=msg.k))
        return Drafted(tokens=(), confidences=(), has_probs=False, seconds=0.0)
