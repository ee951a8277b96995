"""Verifier: checks a sequence's drafts with one target forward and rolls its caches back.

Receives VerifyDrafts (ask: replies Verified). Asks the owner to run the target over
[last, d_1..d_K] and apply the acceptance rule (exact greedy match at temperature 0, rejection
sampling above it), then tells the owner to trim every cache to the accepted prefix.
"""

from __future__ import annotations

from typing import assert_never

from runtime.actor import Actor
from runtime.messages import Rollback, Sample, Verified, VerifyDrafts


class Verifier(Actor):
    name = "verifier"

    def __init__(self, owner: Actor, telemetry: Actor):
        super().__init__(inbox_size=64)
        self.owner, self.telemetry = owner, telemetry

    async def handle(self, msg: VerifyDrafts) -> Verified:
        match msg:
            case VerifyDrafts():
                verified = await self.owner.ask(msg)
            case _:
                assert_never(msg)
        if not 0 <= verified.accepted <= len(msg.drafts) or len(verified.emitted) != verified.accepted + 1:
            raise RuntimeError(f"inconsistent verification: {verified.accepted} of {len(msg.drafts)} "
                               f"accepted, {len(verified.emitted)} emitted")
        await self.owner.tell(Rollback(seq_id=msg.seq_id, drafted=len(msg.drafts), accepted=verified.accepted,
                                       emitted=verified.emitted))
        self.log.debug("verified", request_id=msg.seq_id, drafted=len(msg.drafts), accepted=verified.accepted)
        await self.telemetry.tell(Sample(name="accepted_tokens_total", value=verified.accepted))
        return verified
