"""Hyper mode in the scheduler with scripted peers: one request at a time in arrival order, each run
bound through the gate; a cancelled waiting request is released and counted; width 1 sends the owner
exactly serial mode's commands; the gate's block on Describe."""

import asyncio

import msgspec

from actors.drafter import Drafter
from actors.scheduler import Scheduler
from actors.verifier import Verifier
from runtime.messages import Admitted, Cancel, Cancelled, Describe, Failed, Finished, SamplingParams, TokensEmitted
from runtime.modes import HyperMode, SerialMode
from runtime.speculation import SpeculationPolicy
from tests.actors.fakes import CharCodec, Collector, ScriptedOwner, ScriptedSpecOwner, Sink
from tests.actors.test_scheduler import admitted, stop, until
from tests.actors.test_speculative_step import SCRIPT


async def running(owner, mode, policy=None):
    streamer, telemetry = Collector(), Sink()
    drafter, verifier = Drafter("ngram", owner, telemetry), Verifier(owner, telemetry)
    scheduler = Scheduler(mode, owner, streamer, telemetry, CharCodec(), policy, drafter, verifier)
    actors = [owner, streamer, telemetry, drafter, verifier, scheduler]
    for actor in actors:
        actor.start()
    return scheduler, streamer, actors


async def test_many_requests_are_served_one_at_a_time_in_arrival_order():
    owner = ScriptedOwner(step_delay=0.001)
    scheduler, events, actors = await running(owner, HyperMode("none"))
    ids = [f"r{i}" for i in range(6)]
    for rid in ids:
        await scheduler.tell(admitted(rid, max_tokens=4))
    await until(lambda: len(events.terminals()) == 6)
    assert all(isinstance(e, Finished) and e.usage.completion_tokens == 4 for e in events.terminals())
    assert [e.request_id for e in events.terminals()] == ids
    emitted = [e.request_id for e in events.events if isinstance(e, TokensEmitted)]
    assert emitted == [rid for rid in ids for _ in range(4)]  # never interleaved
    block = (await scheduler.ask(Describe()))["hyper"]
    assert block["admitted_total"] == block["completed_total"] == 6 and block["active"] == 0
    assert block["queue_wait_s"]["count"] == block["run_s"]["count"] == 6
    assert block["width_stats"]["requests_by_width"] == {1: 6} and block["width_executor_installed"] is False
    await stop(actors)


async def test_a_cancelled_waiting_request_is_released_and_counted():
    owner = ScriptedOwner(step_delay=0.01)
    scheduler, events, actors = await running(owner, HyperMode("none"))
    for rid, n in (("running", 40), ("left", 5), ("after", 3)):
        await scheduler.tell(admitted(rid, max_tokens=n))
    await until(lambda: len(events.of("running")) >= 2)
    block = (await scheduler.ask(Describe()))["hyper"]
    assert block["active"] == 1 and block["queue_depth"] == 2
    await scheduler.tell(Cancel(request_id="left"))
    await until(lambda: len(events.terminals()) == 3, timeout=5)
    outcome = {e.request_id: type(e) for e in events.terminals()}
    assert outcome == {"left": Cancelled, "running": Finished, "after": Finished}
    assert "left" not in owner.positions  # it never reached the model
    block = (await scheduler.ask(Describe()))["hyper"]
    assert block["abandoned_before_start_total"] == 1 and block["completed_total"] == 2
    assert block["queue_depth"] == 0 and block["admitted_total"] == 3
    await stop(actors)


async def test_a_request_cancelled_while_running_ends_its_run():
    owner = ScriptedOwner(step_delay=0.005)
    scheduler, events, actors = await running(owner, HyperMode("none"))
    await scheduler.tell(admitted("long", max_tokens=10_000))
    await scheduler.tell(admitted("next", max_tokens=3))
    await until(lambda: len(events.of("long")) >= 3)
    await scheduler.tell(Cancel(request_id="long"))
    await until(lambda: len(events.terminals()) == 2)
    block = (await scheduler.ask(Describe()))["hyper"]
    assert block["completed_total"] == 2 and block["active"] == 0 and "long" in owner.released
    await stop(actors)


async def test_a_failed_request_is_counted_failed_and_the_next_one_runs():
    owner = ScriptedOwner(fail_on={"bad"})
    scheduler, events, actors = await running(owner, HyperMode("none"))
    await scheduler.tell(admitted("bad"))
    await scheduler.tell(admitted("good", max_tokens=2))
    await until(lambda: len(events.terminals()) == 2)
    assert {e.request_id: type(e) for e in events.terminals()} == {"bad": Failed, "good": Finished}
    block = (await scheduler.ask(Describe()))["hyper"]
    assert block["failed_total"] == 1 and block["completed_total"] == 1
    await stop(actors)


async def served_trajectory(mode):
    """Every command the owner saw and every event emitted, for forced n-gram speculation."""
    scripts = {"a": SCRIPT, "b": SCRIPT[::-1] * 2, "c": SCRIPT}
    owner = ScriptedSpecOwner(scripts)
    scheduler, events, actors = await running(owner, mode, SpeculationPolicy("ngram", 3, "force"))
    for rid, n in (("a", len(SCRIPT)), ("b", 20), ("c", 9)):
        await scheduler.tell(Admitted(request_id=rid, prompt_ids=(1, 2, 3), submitted_at=0.0,
                                      params=SamplingParams(max_tokens=n)))
    async with asyncio.timeout(5):
        while len(events.terminals()) < 3:
            await asyncio.sleep(0.002)
    await stop(actors)
    steps = [(type(e).__name__, e.request_id, getattr(e, "token_ids", None)) for e in events.events]
    receipts = [(e.usage.completion_tokens, msgspec.structs.replace(e.usage.speculation, verify_seconds=0.0,
                                                                      plain_seconds=0.0)) for e in events.terminals()]
    return owner.commands, steps, receipts


async def test_width_one_is_serial_modes_trajectory():
    assert await served_trajectory(HyperMode("none")) == await served_trajectory(SerialMode())


async def test_serial_mode_has_an_empty_hyper_block_and_no_width_fields():
    scheduler, _, actors = await running(ScriptedOwner(), SerialMode())
    state = await scheduler.ask(Describe())
    assert state["hyper"] == {} and "width" not in str(state["serial"])
    await stop(actors)
