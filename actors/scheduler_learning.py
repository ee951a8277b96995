"""The scheduler's upkeep of the online controller (part of the scheduler actor, its own file to keep
each under ~300 lines): each step's cost observed once the next step starts, the self-calibration
run one call at a time while idle, evidence faded and phase switches traced after each step, and
the learned table saved now and then. Sends TimeCell to the model owner.
"""

from __future__ import annotations

import asyncio
import time

from runtime.messages import ActorFailure, Describe
from runtime.owner_messages import TimeCell
from runtime.self_calibration import SELF_CALIBRATED

PERSIST_EVERY_S = 60.0  # the learned cost table is saved this often while serving, and at shutdown
# A check of a prior times a call only once nothing has arrived for this long, and drops a call during
# which something arrived: a call timed while the next request was being admitted (parsed, tokenized
# on the event loop's thread) shared the machine with it, and back-to-back requests made every such
# call late. On a 2-core AMD EPYC one bench run's check read a depth-1 step at 1.58x plain decode
# (served steps cost 1.18x) and chat decoded plainly throughout (0.992x where fixed K=1 paid 1.114x).
CHECK_QUIET_S = 0.2


class ControllerUpkeep:
    def costs_of_last_step(self, batch) -> None:
        """The controller observes the last step's cost up to now, where nothing else ran since it."""
        if (controller := self.policy.controller) is None:
            return
        ids, (ended, energy, last_ids) = tuple(s.request_id for s in batch), self.step_ended
        contiguous = not self.interleaved and ids == last_ids
        controller.step_starting((time.perf_counter() - ended) * 1e3 if contiguous else None,
                                 self.meter.read().since(energy) if contiguous else 0.0)
        self.interleaved = False

    async def quiet_or_next(self):
        """None once the server has been quiet long enough for a call of the calibration (at once for
        a calibration of its own, or right after a check call); else the first message to arrive. A
        question about the state (/health) is answered at once and breaks no quiet: a monitor polling
        /health every 0.2 s kept a fresh server's check from ever running."""
        if not self.calibration.checks or (self.checked_last and self.inbox.empty()):
            return None  # a message already waiting is taken below, at once
        deadline = asyncio.get_running_loop().time() + CHECK_QUIET_S
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    item = await self.inbox.get()  # a cancelled get leaves the queue's items in place
            except TimeoutError:
                return None
            if not _question(item):
                return item
            await self.dispatch(*item)

    async def work_arrived(self) -> bool:
        """Whether work arrived in the inbox (questions about the state are answered here, in order,
        and left out): a check call during which it arrived shared the machine with its admission."""
        questions, work = [], []
        for _ in range(self.inbox.qsize()):
            item = self.inbox.get_nowait()
            (questions if _question(item) else work).append(item)
        for item in work:  # back in their order, before anything can arrive
            self.inbox.put_nowait(item)
        for item in questions:
            await self.dispatch(*item)
        return bool(work)

    async def calibrate_one(self) -> None:
        """One call of the self-calibration: a measurement for the controller where it checks a prior
        measured elsewhere; else the last one starts the online controller."""
        cal = self.calibration
        kind, width, depth = cell = cal.next_cell()
        try:
            timed = await self.owner.ask(TimeCell(kind=kind, width=width, depth=depth))
        except ActorFailure as e:
            self.calibration = None
            self.log.warning("self_calibration_failed", error=str(e))
            return
        if cal.checks:
            self.checked_last = not await self.work_arrived()
            if not self.checked_last:  # something arrived during it: not a measurement, timed again later
                return
        cal.record(cell, timed.ms, timed.joules)
        if cal.checks:
            if cal.measures(cell) and (controller := self.policy.controller) is not None:
                controller.costs.observe(kind, width, depth, timed.ms, timed.joules)
            if cal.done:
                self.calibration = None
                self.log.info("cost_prior_checked", calls=cal.total)
                self.persist()
            return
        if cal.done:
            self.calibration = None
            self.policy.use_controller(self.learning.make_controller(cal.table(), SELF_CALIBRATED))
            self.log.info("self_calibrated", cells=cal.total, plain_ms=round(cal.table().verify_cost(1, 0).ms, 2))
            self.persist()

    def persist(self) -> None:
        """Save what the controller learned (the system says where)."""
        self.persisted_at = time.monotonic()
        if self.learning is not None and self.policy.controller is not None:
            self.learning.save(self.policy.controller.costs)

    async def after_control(self, batch) -> None:
        """The controller's step end: evidence fades, phase decision flips are traced, the learned
        table is saved now and then."""
        controller = self.policy.controller
        if controller is None:
            return
        controller.step_passed(batch)
        for phase, speculates in controller.take_switches():
            self.log.info("phase_decision_switched", phase=phase.value, speculates=speculates, width=len(batch))
        if time.monotonic() - self.persisted_at > PERSIST_EVERY_S:
            self.persist()


def _question(item) -> bool:
    """Whether an inbox item asks about the state (/health): answered at once, it is no work."""
    return isinstance(item[0], Describe)
