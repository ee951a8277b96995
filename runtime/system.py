"""The actor system: builds the actors from the config, starts them in order, supervises, stops.

If an actor's loop dies, the failure is reported and every in-flight request fails with an error,
so no client hangs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import structlog

from actors.admission import Admission
from actors.drafter import Drafter
from actors.model_owner import ModelOwner
from actors.scheduler import Scheduler
from actors.streamer import Streamer
from actors.telemetry import Telemetry
from actors.verifier import Verifier
from runtime.actor import Actor
from runtime.config import Config, ConfigError, with_environment
from runtime.eligibility import ThinkMarkers
from runtime.controller import Learning
from runtime.drain import Drain
from runtime.energy import open_meter
from runtime.messages import ActorFailure, Describe, FailInFlight, FailOpen
from runtime.owner_messages import ModelInfo
from runtime.modes import make_mode
from runtime.prefill_budget import PrefillBudget
from runtime.speculation import SpeculationPolicy
from runtime.text import TextCodec


class System:
    def __init__(self, config: Config, model_dir: Path, owner: Actor | None = None):
        config = with_environment(config)  # a no-op where config set the fields already
        self.config, self.model_dir = config, model_dir
        self.log = structlog.get_logger().bind(actor="system")
        self.codec = TextCodec(model_dir)
        if config.spec.drafter == "draft-model":
            check_same_tokenizer(self.codec, config.spec.draft_model)
        self.telemetry = Telemetry()
        self.owner = owner or make_owner(config, model_dir)
        self.owner.telemetry = self.telemetry  # the prompt cache's samples
        self.streamer = Streamer(None, self.telemetry)
        self.scheduler: Scheduler | None = None  # built once the model is loaded (it needs the drafter)
        self.admission: Admission | None = None
        self.drafter: Drafter | None = None
        self.verifier: Verifier | None = None
        self.started_at = time.monotonic()
        self.failure: str | None = None
        self.drain = Drain()  # open requests, and whether new ones are still admitted (SIGTERM)

    @property
    def info(self) -> ModelInfo:
        return self.owner.info

    def _size_inboxes(self, actors: list[Actor]) -> None:
        """Each actor's inbox bound from Config.actors, before it starts."""
        sizes = self.config.actors
        bound = {self.telemetry: sizes.telemetry_inbox, self.owner: sizes.owner_inbox,
                 self.drafter: sizes.drafter_inbox, self.verifier: sizes.verifier_inbox,
                 self.streamer: sizes.streamer_inbox, self.scheduler: sizes.scheduler_inbox,
                 self.admission: sizes.admission_inbox}
        for actor in actors:
            actor.size_inbox(bound[actor])

    def order(self) -> list[Actor]:
        return [self.telemetry, self.owner, self.drafter, self.verifier, self.streamer, self.scheduler,
                self.admission]

    async def start(self) -> None:
        self._size_inboxes(self.order()[:2])
        for actor in self.order()[:2]:
            actor.start()
            await actor.started()
        self._wire_after_load()
        self._size_inboxes(self.order()[2:])
        for actor in self.order()[2:]:
            actor.start()
            await actor.started()
        for actor in self.order():
            actor._task.add_done_callback(self._watch)
        self.log.info("system_started", model=self.info.model_id, mode=self.config.scheduler.mode,
                      blas=self.info.blas, matmul=self.info.matmul)

    def _wire_after_load(self) -> None:
        """Admission needs the context length and speculation the drafter, known once the model is loaded."""
        spec, info = self.config.spec, self.info
        self.drafter = Drafter(info.drafter, self.owner, self.telemetry, spec.ngram_max)
        self.verifier = Verifier(self.owner, self.telemetry)
        markers = ThinkMarkers(start=self.codec.think_ids[0], end=self.codec.think_ids[1]) \
            if self.codec.think_ids else ThinkMarkers()
        sched = self.config.scheduler
        controller, learning = self._controller()
        policy = SpeculationPolicy(info.drafter, spec.num_draft_tokens, spec.mtp_gate, controller=controller,
                                   think_markers=markers, pin_tokens=spec.entry_pin_tokens,
                                   spec_think=bool(spec.spec_think), mtp_max_seqs=sched.mtp_max_seqs,
                                   gate_config=self.config.gate, suppress_tool_call=spec.suppress_tool_call)
        budget = PrefillBudget(sched.prefill_steps_per_chunk, sched.prefill_floor, sched.prefill_ceiling)
        self.scheduler = Scheduler(make_mode(sched), self.owner, self.streamer, self.telemetry, self.codec, policy,
                                   self.drafter, self.verifier, watts_per_core=spec.watts_per_core, budget=budget,
                                   learning=learning, forced_drafts=spec.forced_drafts)
        self.admission = Admission(self.config.admission, self.codec, info.context_length,
                                   self.scheduler, self.telemetry)
        self.streamer.admission = self.admission
        self.owner.scheduler = self.scheduler  # fails requests whose state a failed owner tell left unknown

    def _controller(self):
        """The online controller from the best cost prior at hand, and what keeps it learning; without
        a prior, a self-calibration runs while the server is idle and starts it (the gate decides
        until then); a prior measured elsewhere is checked the same way while the controller runs."""
        spec = self.config.spec
        if spec.cost_model == "off" or self.info.drafter == "none":
            return None, None
        from runtime.calibrate import model_id, table_path
        from runtime.cost_prior import load_prior, save_learned
        from runtime.cost_table import machine_id
        from runtime.online_cost import OWN_PRIORS

        model, machine = model_id(self.model_dir), spec.machine_id or machine_id()
        learned = table_path(model, self.info.drafter, self.config.model.cache_dir)
        own = None
        if (group := self.describe_group()) is not None:  # a split model's steps cost what its group's do
            machine = f"{machine} | {group['parallel']} over {group['size']} processes"
            own = learned = table_path(f"{model} {group['parallel']}{group['size']}", self.info.drafter,
                                       self.config.model.cache_dir)
        energy_source = open_meter(spec.watts_per_core).source
        learning = Learning(save=lambda costs: save_learned(costs, learned, machine=machine, blas=self.info.compute,
                                                            energy_source=energy_source, log=self.log),
                            make_controller=self._make_controller)
        found = load_prior(model, self.info.drafter, self.config.model.cache_dir, machine, self.log,
                           blas=self.info.compute, first=own)
        calibrates = self.info.drafter in ("mtp", "ngram")
        if found is not None:
            if calibrates and found[1] not in OWN_PRIORS:  # measured elsewhere: checked here while idle
                learning.calibration = self._self_calibration(model, machine, energy_source, checks=True)
                self.log.info("cost_prior_check_started", source=found[1], calls=learning.calibration.total)
            return self._make_controller(*found), learning
        if calibrates:
            learning.calibration = self._self_calibration(model, machine, energy_source)
            self.log.info("self_calibration_started", cells=learning.calibration.total)
        else:
            self.log.warning("no_cost_table", model=model, drafter=self.info.drafter,
                             fallback_depth=spec.num_draft_tokens,
                             hint="run `metrale calibrate` to let the planner choose draft depths")
        return None, learning

    def _make_controller(self, table, source: str):
        from runtime.controller import OnlineController
        from runtime.exploration import ExplorationBudget
        from runtime.online_cost import OnlineCostModel

        spec = self.config.spec
        return OnlineController(OnlineCostModel(table, source), max_k=spec.num_draft_tokens, slack=spec.cost_slack,
                                mtp_max_seqs=self.config.scheduler.mtp_max_seqs,
                                budget=ExplorationBudget(share=spec.exploration_share))

    def _self_calibration(self, model: str, machine: str, energy_source: str, checks: bool = False):
        from runtime.cost_table import TableMeta
        from runtime.self_calibration import WIDTHS, SelfCalibration, checked_widths

        sched = self.config.scheduler
        widths = checked_widths(min(sched.max_active_requests, sched.mtp_max_seqs)) if checks else WIDTHS
        meta = TableMeta(model_id=model, drafter=self.info.drafter, machine=machine, dtype=self.info.dtype,
                         blas=self.info.compute, energy_source=energy_source,
                         watts_per_core=self.config.spec.watts_per_core, date="")
        return SelfCalibration(meta, self.config.spec.num_draft_tokens, widths=widths, checks=checks)

    def _watch(self, task: asyncio.Task) -> None:
        if task.cancelled() or self.failure is not None:
            return
        error = task.exception()
        crashed = error is not None or not self._stopping
        if crashed:
            self.failure = f"{task.get_name()} stopped: {error!r}"
            self.log.error("actor_crashed", crashed_actor=task.get_name(), error=repr(error))
            asyncio.get_running_loop().create_task(self._fail_in_flight())

    async def _fail_in_flight(self) -> None:
        """Each actor fails what it holds: the scheduler its sequences, then the streamer any request
        still open (admitted but not yet scheduled, or the scheduler itself is gone)."""
        error, status = self.failure or "actor failure", 503
        try:
            await asyncio.wait_for(self.scheduler.ask(FailInFlight(error=error, status=status)), 10)
        except (ActorFailure, asyncio.TimeoutError):
            pass  # the scheduler is the actor that stopped
        if not self.streamer.closing:
            await self.streamer.tell(FailOpen(error=error, status=status))

    async def describe_prompt_cache(self) -> dict | None:
        """The model owner's account of its prompt cache (an ask, as for the scheduler)."""
        try:
            return await asyncio.wait_for(self.owner.ask(Describe()), 10)
        except (ActorFailure, asyncio.TimeoutError):
            return None

    def describe_owner(self) -> dict:
        """What each kind of model-owner command has cost (mean ms, count)."""
        describe = getattr(self.owner, "describe_timings", None)
        return describe() if describe is not None else {}

    def describe_group(self) -> dict | None:
        """The distributed group's account (None when this server runs alone)."""
        describe = getattr(self.owner, "describe_group", None)
        return describe() if describe is not None else None

    async def describe_scheduler(self) -> dict | None:
        """The scheduler's own account of its state (an ask: nothing outside it reads its containers)."""
        try:
            return await asyncio.wait_for(self.scheduler.ask(Describe()), 10)
        except (ActorFailure, asyncio.TimeoutError):
            return None

    _stopping = False

    async def stop(self) -> None:
        """Cancel in-flight requests (each gets its terminal event), then stop in reverse order."""
        self._stopping = True
        for actor in reversed(self.order()):
            if actor is not None:
                await actor.close()
        self.log.info("system_stopped")


def owner_args(config: Config, model_dir: Path) -> tuple[tuple, dict]:
    """ModelOwner's arguments from the config (every rank of a distributed group builds the same)."""
    args = (model_dir, config.model.prefill_step, config.spec)
    batched = config.scheduler.mode == "mtp_batch"
    return args, {"batched": batched, "rows_kernel": config.model.rows_kernel,
                  "compiled_layers": config.model.compiled_layers, "fused_kernels": config.model.fused_kernels,
                  "prompt_cache": (config.model.prompt_cache_size, config.model.prompt_cache_bytes)}


def make_owner(config: Config, model_dir: Path) -> Actor:
    """The model owner; distributed, rank 0's (actors/group_owner.py); with the test-only
    fault_after_steps, one that fails one step (runtime/faults.py)."""
    args, kwargs = owner_args(config, model_dir)
    if config.distributed.enabled:
        from actors.group_owner import GroupOwner

        return GroupOwner(*args, **kwargs, group=config.distributed)
    if config.model.fault_after_steps is None:
        return ModelOwner(*args, **kwargs)
    from runtime.faults import FaultOnceOwner

    return FaultOnceOwner(*args, **kwargs, fault_after_steps=config.model.fault_after_steps)


def check_same_tokenizer(codec: TextCodec, draft_model: str) -> None:
    """A draft model must share the target's vocabulary, or its drafts mean other tokens."""
    draft = TextCodec(draft_model)
    if draft.tok.get_vocab() != codec.tok.get_vocab():
        raise ConfigError(f"--draft-model {draft_model}: its tokenizer differs from the served model's; "
                          "a draft model must use the same vocabulary")
