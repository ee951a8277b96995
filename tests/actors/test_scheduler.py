"""The scheduler with a scripted owner: endings, cancels, failures, one terminal event each."""

import asyncio

import pytest

from actors.scheduler import Scheduler
from runtime.messages import Admitted, Cancel, Cancelled, Failed, Finished, SamplingParams, TokensEmitted
from runtime.modes import SerialMode
from tests.actors.fakes import EOS, CharCodec, Collector, ScriptedOwner, Sink


async def running(owner):
    streamer, telemetry = Collector(), Sink()
    scheduler = Scheduler(SerialMode(), owner, streamer, telemetry, CharCodec())
    for actor in (owner, streamer, telemetry, scheduler):
        actor.start()
    return scheduler, streamer, [owner, streamer, telemetry, scheduler]


async def stop(actors):
    for actor in reversed(actors):
        await actor.close()


def admitted(rid, max_tokens=5, stop=()):
    return Admitted(request_id=rid, prompt_ids=(1, 2, 3), submitted_at=0.0,
                    params=SamplingParams(max_tokens=max_tokens, stop=stop))


async def until(predicate, timeout=2.0):
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.002)


async def test_length_eos_and_stop_string_endings():
    owner = ScriptedOwner({"eos": [1, 2, EOS, 3], "stop": [1, 2, 3, 4, 5, 6]})
    scheduler, events, actors = await running(owner)
    await scheduler.tell(admitted("len", max_tokens=4))
    await scheduler.tell(admitted("eos", max_tokens=10))
    await scheduler.tell(admitted("stop", max_tokens=10, stop=("cd",)))
    await until(lambda: len(events.terminals()) == 3)
    done = {e.request_id: e for e in events.terminals()}
    assert done["len"].finish_reason == "length" and done["len"].usage.completion_tokens == 4
    assert done["eos"].finish_reason == "stop" and done["eos"].usage.completion_tokens == 2
    assert done["stop"].finish_reason == "stop"
    text = "".join(e.text for e in events.of("stop") if isinstance(e, TokensEmitted))
    assert text == "ab"  # the stop string and what follows are not shown
    assert "".join(e.text for e in events.of("len") if isinstance(e, TokensEmitted)) == "abcd"
    assert sorted(owner.released) == ["eos", "len", "stop"]
    await stop(actors)


async def test_serial_mode_runs_one_request_at_a_time_in_order():
    owner = ScriptedOwner()
    scheduler, events, actors = await running(owner)
    for rid in ("a", "b", "c"):
        await scheduler.tell(admitted(rid, max_tokens=3))
    await until(lambda: len(events.terminals()) == 3)
    order = [e.request_id for e in events.events if isinstance(e, TokensEmitted)]
    assert order == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    await stop(actors)


async def test_cancel_waiting_and_active_requests():
    owner = ScriptedOwner(step_delay=0.01)
    scheduler, events, actors = await running(owner)
    await scheduler.tell(admitted("active", max_tokens=1000))
    await scheduler.tell(admitted("waiting", max_tokens=5))
    await until(lambda: len(events.of("active")) >= 2)
    await scheduler.tell(Cancel(request_id="waiting"))
    await scheduler.tell(Cancel(request_id="active"))
    await scheduler.tell(Cancel(request_id="active"))  # a second cancel is harmless
    await until(lambda: len(events.terminals()) == 2)
    await asyncio.sleep(0.05)
    assert all(isinstance(e, Cancelled) for e in events.terminals())
    assert len(events.terminals()) == 2
    assert "active" in owner.released and not scheduler.active and not scheduler.waiting
    await stop(actors)


async def test_owner_failure_fails_only_that_request():
    owner = ScriptedOwner(fail_on={"bad"})
    scheduler, events, actors = await running(owner)
    await scheduler.tell(admitted("bad"))
    await scheduler.tell(admitted("good", max_tokens=2))
    await until(lambda: len(events.terminals()) == 2)
    outcome = {e.request_id: type(e) for e in events.terminals()}
    assert outcome == {"bad": Failed, "good": Finished}
    assert "scripted failure" in next(e for e in events.terminals() if isinstance(e, Failed)).error
    await stop(actors)


async def test_shutdown_cancels_in_flight_requests_with_a_terminal_event():
    owner = ScriptedOwner(step_delay=0.005)
    scheduler, events, actors = await running(owner)
    await scheduler.tell(admitted("long", max_tokens=10_000))
    await scheduler.tell(admitted("queued", max_tokens=10))
    await until(lambda: len(events.of("long")) >= 2)
    await scheduler.close()
    await asyncio.sleep(0.02)
    terminals = events.terminals()
    assert sorted(e.request_id for e in terminals) == ["long", "queued"]
    assert all(isinstance(e, Cancelled) and e.reason == "shutdown" for e in terminals)
    await stop(actors)


@pytest.mark.parametrize("n", [1, 7])
async def test_every_request_gets_exactly_one_terminal_event(n):
    owner = ScriptedOwner()
    scheduler, events, actors = await running(owner)
    for i in range(n):
        await scheduler.tell(admitted(f"r{i}", max_tokens=1 + i % 3))
        if i % 2:
            await scheduler.tell(Cancel(request_id=f"r{i}"))
    await until(lambda: len(events.terminals()) == n)
    await asyncio.sleep(0.02)
    ids = [e.request_id for e in events.terminals()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(n))
    await stop(actors)


async def test_fail_in_flight_with_ids_fails_only_those_requests():
    from runtime.messages import FailInFlight

    scheduler, events, actors = await running(ScriptedOwner())
    await scheduler.tell(admitted("lost", max_tokens=400))
    await scheduler.tell(admitted("fine", max_tokens=400))
    await until(lambda: any(e.request_id == "lost" for e in events.events if isinstance(e, TokensEmitted)))
    await scheduler.tell(FailInFlight(error="state lost", status=500, request_ids=("lost",)))
    await until(lambda: len(events.terminals()) == 2, timeout=10.0)
    outcome = {e.request_id: type(e) for e in events.terminals()}
    assert outcome == {"lost": Failed, "fine": Finished}
    await stop(actors)


async def test_a_failed_owner_tell_fails_its_sequences_through_the_scheduler():
    """A Rollback (a tell: nobody waits for it) that raises leaves the sequence's state unknown:
    the owner tells the scheduler to fail it, without waiting on the scheduler's inbox."""
    from pathlib import Path

    from actors.model_owner import ModelOwner
    from runtime.messages import FailInFlight
    from runtime.owner_messages import Rollback

    class Broken:
        def rollback(self, *args):
            raise RuntimeError("no such cache")

        def close(self):
            pass

    class Unloaded(ModelOwner):
        async def setup(self):  # the engine is the one above: no model to load
            pass

    told = Collector()
    owner = Unloaded(Path("unused"))
    owner.engine, owner.scheduler = Broken(), told
    for actor in (owner, told):
        actor.start()
    await owner.tell(Rollback(seq_id="r1", drafted=2, accepted=1, emitted=(5, 6)))
    await until(lambda: told.events)
    (msg,) = told.events
    assert isinstance(msg, FailInFlight) and msg.request_ids == ("r1",) and msg.status == 500
    assert "no such cache" in msg.error
    await stop([owner, told])
