"""Verifier: checks a sequence's drafts with one target forward and rolls its caches back.

Receives VerifyDrafts (ask: replies Verified) and VerifyBatch (ask: replies VerifiedBatch). Asks the
owner to run the target over [last, d_1..d_K] of each sequence and apply the acceptance rule (exact
greedy match at temperature 0, rejection sampling above it), then tells the owner to trim each
sequence's caches to its accepted prefix (a ragged rollback: rows accept different lengths).
"""

from __future__ import annotations

from typing import assert_never

from runtime.actor import Actor
from runtime.messages import Sample
from runtime.owner_messages import Rollback, Verified, VerifiedBatch, VerifyBatch, VerifyDrafts


class Verifier(Actor):
    name = "verifier"

    def __init__(self, owner: Actor, telemetry: Actor):
        super().__init__()  # its inbox bound: Config.actors
        self.owner, self.telemetry = owner, telemetry

    async def handle(self, msg: VerifyDrafts | VerifyBatch) -> Verified | VerifiedBatch:
        match msg:
            case VerifyDrafts():
                verified = await self.owner.ask(msg)
                await self.settle(msg, verified)
                return verified
            case VerifyBatch():
                batch = await self.owner.ask(msg)
                for row, verified in zip(msg.rows, batch.results, strict=True):
                    await self.settle(row, verified)
                return batch
            case _:
                assert_never(msg)

    async def settle(self, row: VerifyDrafts, verified: Verified) -> None:
        """Check the result and roll the sequence's caches back to its accepted prefix."""
        if not 0 <= verified.accepted <= len(row.drafts) or len(verified.emitted) != verified.accepted + 1:
            raise RuntimeError(f"inconsistent verification: {verified.accepted} of {len(row.drafts)} "
                               f"accepted, {len(verified.emitted)} emitted")
        if not row.drafts:
            return  # a plain row: nothing to roll back
        await self.owner.tell(Rollback(seq_id=row.seq_id, drafted=len(row.drafts), accepted=verified.accepted,
                                       emitted=verified.emitted))
        self.log.debug("verified", request_id=row.seq_id, drafted=len(row.drafts), accepted=verified.accepted)
        await self.telemetry.tell(Sample(name="accepted_tokens_total", value=verified.accepted))
