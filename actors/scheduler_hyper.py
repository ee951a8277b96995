"""Hyper mode's runs (spec/hyper.md): one request at a time, each bound through the HyperAdmissionGate.

Part of the scheduler actor (its own file to keep each under ~300 lines). A request's ticket is taken
when it arrives (runtime/modes.py, HyperMode); when none runs, the first waiting one is bound: the
gate returns its run, the serial closure itself at width 1, or the installed width executor's cohort
(actors/scheduler_tree.py), which runs that same closure and widens its speculative steps. A run is
an async iterator with one step per iteration, so the scheduler's loop still reads its inbox
(cancels, new arrivals, Describe) between steps exactly as in serial mode; the steps themselves are
serial mode's (prefill, then the same decode step), so width 1 emits the serial trajectory.
"""

from __future__ import annotations

from runtime.messages import ActorFailure
from runtime.owner_messages import Branching, CanBranch
from runtime.sequence import Sequence, Status


class RunFailed(Exception):
    """A run whose request failed (the failure was already sent to its client): the gate counts it."""


class HyperPath:
    def hyper_setup(self) -> None:
        self.hyper_run = None  # the bound run of the request being served
        self.widening = None  # the width executor, while it runs a cohort
        self.run_width = 1  # the widest step of the current run
        self.ran_step = False  # whether the run's latest iteration ran a prefill or a step
        gate = getattr(self.mode, "gate", None)
        if gate is not None and self.mode.width_executor == "tree":
            from actors.scheduler_tree import TreeExecutor

            gate.install_width_executor(TreeExecutor(self, self.mode.max_width))

    async def hyper_step(self) -> None:
        """Advance the current run one step, or bind the next waiting request and start it."""
        while True:
            if self.hyper_run is None and not await self.bind_next():
                return
            self.ran_step = False
            try:
                await anext(self.hyper_run)
                return
            except (StopAsyncIteration, RunFailed):
                self.hyper_run = None  # settled by the gate as it ended
                self.mode.gate.record_cohort_width(self.run_width)
                if self.ran_step:  # its last step ran now: the next request starts next step, as in serial
                    return

    async def bind_next(self) -> bool:
        started = self.mode.admit(self.waiting, self.active)  # serial's rule: the first waiting, none active
        if not started:
            return False
        seq = started[0]
        await self.ask_branching()
        self.run_width = 1
        self.hyper_run = self.mode.bind(seq, lambda: self.serial_run(seq))()
        return True

    async def serial_run(self, seq: Sequence):
        """The serial closure: prefill and serial mode's decode steps (the first right after the
        prefill, as serial mode's), one step per iteration; it ends as soon as its request does."""
        self.ran_step = True
        await self.prefill(seq)
        first = True
        while seq.status is Status.DECODING:
            if not first:
                yield
                if seq.status is not Status.DECODING:  # cancelled or failed between steps
                    break
                self.ran_step = True
            first = False
            await self.decode_step([seq])
        if seq.status is Status.FAILED:
            raise RunFailed(seq.request_id)

    async def ask_branching(self) -> None:
        """Once, before the first run: whether the owner's model and drafter can verify trees."""
        executor = self.mode.gate.executor
        if executor is None or executor.support is not None:
            return
        try:
            reply = await self.owner.ask(CanBranch())
        except ActorFailure as e:
            reply = Branching(ok=False, reason=str(e))
        executor.support = reply if isinstance(reply, Branching) else Branching(ok=False, reason="no reply")
        if not executor.support.ok:
            self.log.info("width_executor_off", reason=executor.support.reason)
