"""A server with no cost table calibrates itself while idle, then the online controller decides."""

import asyncio

from actors.scheduler import Scheduler
from runtime.controller import Learning, OnlineController
from runtime.cost_table import TableMeta
from runtime.messages import Admitted, Finished, SamplingParams
from runtime.owner_messages import CellTimed, TimeCell
from runtime.modes import SerialMode
from runtime.online_cost import OnlineCostModel
from runtime.self_calibration import SELF_CALIBRATED, SelfCalibration
from runtime.speculation import SpeculationPolicy
from tests.actors.fakes import CharCodec, Collector, ScriptedOwner, Sink

META = TableMeta(model_id="m", drafter="ngram", machine="this cpu", dtype="float32", blas="openblas",
                 energy_source="cpu_proxy", watts_per_core=10.0, date="")


class TimingOwner(ScriptedOwner):
    """A scripted owner that also answers the self-calibration's TimeCell with known costs."""

    async def handle(self, msg):
        if isinstance(msg, TimeCell):
            self.commands.append("TimeCell")
            await asyncio.sleep(0.001)
            ms = (50.0 + 10 * msg.depth) * msg.width ** 0.5 if msg.kind == "verify" else 2.0 * msg.depth
            return CellTimed(ms=ms, joules=ms / 50)
        return await super().handle(msg)


async def test_the_calibration_runs_when_idle_and_starts_the_controller():
    owner, streamer, telemetry = TimingOwner(), Collector(), Sink()
    policy = SpeculationPolicy("ngram", 2, "auto")
    saved = []
    learning = Learning(save=saved.append, calibration=SelfCalibration(META, max_k=2),
                        make_controller=lambda table, source: OnlineController(
                            OnlineCostModel(table, source), max_k=2, slack=0.1, mtp_max_seqs=32))
    scheduler = Scheduler(SerialMode(), owner, streamer, telemetry, CharCodec(), policy, learning=learning)
    actors = [owner, streamer, telemetry, scheduler]
    for actor in actors:
        actor.start()
    # A request arriving mid-calibration is served between two calls, not after the calibration.
    await asyncio.sleep(0.005)
    await scheduler.tell(Admitted(request_id="r", prompt_ids=(1, 2), params=SamplingParams(max_tokens=3,
                                                                                           disable_mtp=True),
                                  submitted_at=0.0))
    async with asyncio.timeout(5):
        await streamer.terminal.wait()
        while policy.controller is None:
            await asyncio.sleep(0.01)
    assert isinstance(streamer.terminals()[0], Finished)
    first_prefill = owner.commands.index("Prefill")
    assert "TimeCell" in owner.commands[first_prefill:]  # calibration went on after the request
    assert policy.gate is None and policy.controller.costs.source == SELF_CALIBRATED
    table = policy.controller.costs.prior
    assert table.widths == (1, 2, 4) and table.verify_cost(4, 2).ms == 140.0
    assert owner.commands.count("TimeCell") == scheduler_cells(2)
    assert saved and saved[0] is policy.controller.costs  # the calibrated table is saved at once
    for actor in reversed(actors):
        await actor.close()


def scheduler_cells(max_k: int) -> int:
    return SelfCalibration(META, max_k).total
