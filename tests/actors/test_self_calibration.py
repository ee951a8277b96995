"""A server with no cost table calibrates itself while idle, then the online controller decides; one
whose table was measured elsewhere starts the controller from it at once and checks it while idle."""

import asyncio

import pytest

from actors.scheduler import Scheduler
from runtime.controller import Learning, OnlineController
from runtime.cost_table import AcceptanceCalibration, Cost, TableMeta, make_table
from runtime.messages import Admitted, Describe, Finished, SamplingParams
from runtime.owner_messages import CellTimed, Decode, TimeCell
from runtime.modes import SerialMode
from runtime.online_cost import OnlineCostModel
from runtime.self_calibration import CHECK_REPEATS, SELF_CALIBRATED, SelfCalibration, checked_widths
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
        if isinstance(msg, Decode):  # a served plain step costs what the cell says: both are measurements
            await asyncio.sleep(0.05)
        return await super().handle(msg)


async def test_the_calibration_runs_when_idle_and_starts_the_controller():
    owner, streamer, telemetry = TimingOwner(), Collector(), Sink()
    policy = SpeculationPolicy("ngram", 2, "auto")
    saved = []
    learning = Learning(save=saved.append, calibration=SelfCalibration(META, max_k=2),
                        make_controller=lambda table, source: OnlineController(
                            OnlineCostModel(table, source), max_k=2, slack=0.1, mtp_max_seqs=32))
    scheduler, actors = await _one_request_amid_calls(owner, streamer, telemetry, policy, learning,
                                                      lambda scheduler: policy.controller is not None)
    assert policy.gate is None and policy.controller.costs.source == SELF_CALIBRATED
    table = policy.controller.costs.prior
    assert table.widths == (1, 2, 4) and table.verify_cost(4, 2).ms == 140.0
    assert owner.commands.count("TimeCell") == scheduler_cells(2)
    assert saved and saved[0] is policy.controller.costs  # the calibrated table is saved at once
    for actor in reversed(actors):
        await actor.close()


async def _one_request_amid_calls(owner, streamer, telemetry, policy, learning, done):
    """Start a scheduler whose self-calibration runs; a request arriving amid its calls is served
    between two of them, not after them all. Waits for the request's end and for done(scheduler)."""
    scheduler = Scheduler(SerialMode(), owner, streamer, telemetry, CharCodec(), policy, learning=learning)
    actors = [owner, streamer, telemetry, scheduler]
    for actor in actors:
        actor.start()
    await asyncio.sleep(0.005)
    await scheduler.tell(Admitted(request_id="r", prompt_ids=(1, 2), params=SamplingParams(max_tokens=3,
                                                                                           disable_mtp=True),
                                  submitted_at=0.0))
    async with asyncio.timeout(10):
        await streamer.terminal.wait()
        while not done(scheduler):
            await asyncio.sleep(0.01)
    assert isinstance(streamer.terminals()[0], Finished)
    assert "TimeCell" in owner.commands[owner.commands.index("Prefill"):]  # the calls went on after it
    return scheduler, actors


def scheduler_cells(max_k: int) -> int:
    return SelfCalibration(META, max_k).total


async def test_a_prior_measured_elsewhere_is_checked_while_idle_and_corrected_by_it():
    """The controller decides from the foreign table at once; the check's calls, served requests
    between them, feed its cells: depths 1 and 2, priced at 1.45x and 1.9x plain decode by the
    foreign table, are read near what they cost here (1.2x, 1.4x) once the check is done."""
    owner, streamer, telemetry = TimingOwner(), Collector(), Sink()
    policy = SpeculationPolicy("ngram", 2, "auto")
    foreign = make_table(meta=META, widths=(1, 2, 4), depths=(0, 1, 2),
                         verify=lambda n, k: Cost(ms=(50.0 + 20 * k + 2.5 * k * k) * n ** 0.5, joules=1.0),
                         draft=lambda n, k: Cost(ms=2.0 * k, joules=0.04 * k),
                         calibration=AcceptanceCalibration(by_depth=(0.3, 0.2)))
    costs = OnlineCostModel(foreign, "foreign-shipped")
    policy.use_controller(OnlineController(costs, max_k=2, slack=0.1, mtp_max_seqs=32))
    check = SelfCalibration(META, max_k=2, checks=True)
    saved = []
    learning = Learning(save=saved.append, calibration=check, make_controller=None)
    scheduler, actors = await _one_request_amid_calls(owner, streamer, telemetry, policy, learning,
                                                      lambda scheduler: scheduler.calibration is None)
    assert policy.controller.costs is costs and costs.source == "foreign-shipped"
    assert owner.commands.count("TimeCell") == check.total
    costs.flush()
    # Five measurements a cell: each still leans on its width's level (SHRINK), so depth 2, 36% off
    # in the prior, reads ~9% off (1.52x); served steps at that depth take it the rest of the way.
    # Depth 1, 21% off, reads within ~4% (the served request's plain steps cost a little over 50 ms).
    for depth, cost_here, within in ((1, 1.2, 0.06), (2, 1.4, 0.10)):
        read = costs.cost("verify", 1, depth).ms / costs.cost("verify", 1, 0).ms
        assert abs(read / cost_here - 1) < within
    assert saved and saved[-1] is costs  # what the check taught is saved at once
    for actor in reversed(actors):
        await actor.close()


def test_the_check_times_each_speculative_cell_between_plain_steps_of_its_width():
    check = SelfCalibration(META, max_k=3, checks=True)
    queue = check.queue
    for i, (kind, width, depth) in enumerate(queue):
        if kind == "verify" and depth == 0:
            continue
        before = next(c for c in reversed(queue[:i]) if c[0] == "verify" and c[2] == 0)
        after = next(c for c in queue[i:] if c[0] == "verify" and c[2] == 0)
        assert before[1] == after[1] == width
    assert {c for c in queue} == set(check.samples)  # every cell of the table is timed


@pytest.mark.parametrize("widest, widths", [(0, (1,)), (1, (1,)), (2, (1, 2)), (3, (1, 2)), (4, (1, 2, 4)),
                                            (32, (1, 2, 4))])
def test_a_check_times_only_the_widths_the_server_decodes_at(widest, widths):
    """A serial server (batches of one) checks width 1 alone: its few idle moments go to the cells it uses."""
    assert checked_widths(widest) == widths
    check = SelfCalibration(META, max_k=2, widths=checked_widths(widest), checks=True)
    assert {width for _, width, _ in check.queue} == set(widths)


def test_a_check_measures_the_shallowest_depth_first():
    """Depth 1's verify and draft are fed (their second call: the first traces) within the first six
    idle calls, before any deeper cell is timed: the planner's first decisions turn on them."""
    check = SelfCalibration(META, max_k=3, widths=(1,), checks=True)
    first_fed = {}
    for i, cell in enumerate(list(check.queue)):
        check.record(cell, 10.0, 1.0)
        if check.measures(cell):
            first_fed.setdefault(cell, i + 1)
    assert first_fed[("verify", 1, 1)] <= 6 and first_fed[("draft", 1, 1)] <= 6
    depth_of_call = [depth for _, _, depth in SelfCalibration(META, max_k=3, widths=(1,), checks=True).queue
                     if depth]
    assert depth_of_call == sorted(depth_of_call)


class SlowCells(TimingOwner):
    """A timing owner whose cell calls take `seconds` of wall time."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    async def handle(self, msg):
        if isinstance(msg, TimeCell):
            await asyncio.sleep(self.seconds)
        return await super().handle(msg)


def _checking_scheduler(owner):
    """A started serial scheduler whose controller starts from a foreign table and checks it while idle."""
    streamer, telemetry = Collector(), Sink()
    policy = SpeculationPolicy("ngram", 1, "auto")
    foreign = make_table(meta=META, widths=(1,), depths=(0, 1),
                         verify=lambda n, k: Cost(ms=50.0 + 20 * k, joules=1.0),
                         draft=lambda n, k: Cost(ms=2.0 * k, joules=0.04 * k),
                         calibration=AcceptanceCalibration(by_depth=(0.3,)))
    policy.use_controller(OnlineController(OnlineCostModel(foreign, "foreign-shipped"), max_k=1, slack=0.1,
                                           mtp_max_seqs=32))
    check = SelfCalibration(META, max_k=1, widths=(1,), checks=True)
    learning = Learning(save=lambda costs: None, calibration=check, make_controller=None)
    scheduler = Scheduler(SerialMode(), owner, streamer, telemetry, CharCodec(), policy, learning=learning)
    actors = [owner, streamer, telemetry, scheduler]
    for actor in actors:
        actor.start()
    return owner, streamer, check, scheduler, actors


async def test_a_check_call_during_which_a_request_arrives_is_not_a_measurement():
    """A check waits for a quiet moment, and a call during which a request arrived (its admission
    shared the machine with the call) is dropped and timed again once the request has been served."""

    owner, streamer, check, scheduler, actors = _checking_scheduler(SlowCells(0.05))
    async with asyncio.timeout(10):
        while "TimeCell" not in owner.commands:  # the first call starts after the quiet moment
            await asyncio.sleep(0.005)
        await scheduler.tell(Admitted(request_id="r", prompt_ids=(1, 2),
                                      params=SamplingParams(max_tokens=2, disable_mtp=True), submitted_at=0.0))
        await streamer.terminal.wait()
        while scheduler.calibration is not None:
            await asyncio.sleep(0.01)
    first_call, prefill = owner.commands.index("TimeCell"), owner.commands.index("Prefill")
    assert first_call < prefill
    assert owner.commands.count("TimeCell") == check.total + 1  # the dropped call, timed again
    assert all(len(samples) == CHECK_REPEATS for cell, samples in check.samples.items() if cell[2])
    for actor in reversed(actors):
        await actor.close()


async def test_a_monitor_polling_health_neither_holds_off_a_check_nor_spoils_its_calls():
    """Questions about the state (what /health asks) are answered at once, inside the quiet moment
    and between calls: polled every 0.05 s, well inside the quiet a check waits for, the check still
    runs, no call of it is dropped, and every poll is answered."""

    owner, streamer, check, scheduler, actors = _checking_scheduler(SlowCells(0.02))
    answers = []
    async with asyncio.timeout(10):
        while scheduler.calibration is not None:
            answers.append(await scheduler.ask(Describe()))
            await asyncio.sleep(0.05)
    assert owner.commands.count("TimeCell") == check.total  # none dropped, none timed twice
    assert len(answers) > 5 and answers[0]["self_calibration"]["role"] == "checks the prior"
    for actor in reversed(actors):
        await actor.close()
