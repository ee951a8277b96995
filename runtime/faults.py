"""The injected owner fault of `metrale bench load` (Config.model.fault_after_steps: test only, off
by default): the real model owner, which raises on one step, once.

The raise happens where a real engine error would, in the owner's handler, so the scheduler fails
that step's requests with a 500 naming it and the server goes on (the supervision path under load).
"""

from __future__ import annotations

from actors.model_owner import ModelOwner
from runtime.owner_messages import Decode, VerifyBatch, VerifyDrafts, VerifyTree

STEPS = (Decode, VerifyDrafts, VerifyBatch, VerifyTree)  # one of each is one step of the model
INJECTED = "injected fault"  # in the error every client of the failed step gets


class FaultOnceOwner(ModelOwner):
    def __init__(self, *args, fault_after_steps: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.fault_after_steps, self.steps = fault_after_steps, 0

    async def handle(self, msg):
        if isinstance(msg, STEPS):
            self.steps += 1
            if self.steps == self.fault_after_steps:
                self.log.warning("fault_injected", step=self.steps)
                raise RuntimeError(f"{INJECTED} at model step {self.steps} (--fault-after-steps, test only)")
        return await super().handle(msg)
