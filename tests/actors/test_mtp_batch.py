"""mtp_batch mode with scripted peers: requests join and leave between steps, rows verify together."""

import asyncio

from actors.drafter import Drafter
from actors.scheduler import Scheduler
from actors.verifier import Verifier
from runtime.messages import Admitted, Cancel, Finished, SamplingParams, TokensEmitted
from runtime.modes import MtpBatchMode
from runtime.speculation import SpeculationPolicy
from tests.actors.fakes import CharCodec, Collector, ScriptedSpecOwner, Sink

SCRIPTS = {
    "a": [1, 2, 3] * 10,
    "b": [4, 5, 6, 7] * 8,
    "c": [8, 9] * 15,
    "late": [3, 1, 4, 1, 5, 9, 2, 6] * 4,
}


async def started(gate: str, max_active: int = 8):
    owner = ScriptedSpecOwner(dict(SCRIPTS))
    streamer, telemetry = Collector(), Sink()
    drafter, verifier = Drafter("ngram", owner, telemetry), Verifier(owner, telemetry)
    policy = SpeculationPolicy("ngram", 3, gate)
    mode = MtpBatchMode(max_active, batch_wait_ms=1.0)
    scheduler = Scheduler(mode, owner, streamer, telemetry, CharCodec(), policy, drafter, verifier)
    actors = [owner, streamer, telemetry, drafter, verifier, scheduler]
    for actor in actors:
        actor.start()
    return owner, streamer, scheduler, actors


async def until(condition, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.001)


def admitted(rid, n, **params):
    return Admitted(request_id=rid, prompt_ids=(1, 2), submitted_at=0.0,
                    params=SamplingParams(max_tokens=n, **params))


async def test_joining_leaving_and_mixed_rows_keep_every_script():
    owner, events, scheduler, actors = await started("force")
    await scheduler.tell(admitted("a", 30))
    await scheduler.tell(admitted("b", 12))
    await scheduler.tell(admitted("c", 20, disable_mtp=True))
    await until(lambda: len([e for e in events.of("a") if isinstance(e, TokensEmitted)]) >= 3)
    await scheduler.tell(admitted("late", 25))  # joins a running batch
    await until(lambda: len(events.terminals()) >= 4)
    for rid, script in SCRIPTS.items():
        tokens = [t for e in events.of(rid) if isinstance(e, TokensEmitted) for t in e.token_ids]
        limit = {"a": 30, "b": 12, "c": 20, "late": 25}[rid]
        assert tokens == script[:limit], rid
    done = {e.request_id: e for e in events.terminals()}
    assert all(isinstance(e, Finished) for e in done.values())
    assert done["c"].usage.speculation.verify_steps == 0  # its rows were plain inside batched steps
    assert done["a"].usage.speculation.verify_steps > 0
    assert max(owner.batches) >= 3
    assert owner.prefill_groups and max(owner.prefill_groups) >= 2  # a, b and c arrived together
    stats = scheduler.describe()["mtp_batch"]
    assert stats["rows_verified"] > 0 and max(stats["batch_width_histogram"]) >= 3
    for actor in reversed(actors):
        await actor.close()


async def test_max_active_bounds_the_batch_and_cancel_frees_a_slot():
    owner, events, scheduler, actors = await started("off", max_active=2)
    owner.step_delay = 0.005  # slow enough that a and b are still running when we look
    for rid, n in (("a", 30), ("b", 30), ("c", 5)):
        await scheduler.tell(admitted(rid, n))
    await asyncio.sleep(0.05)
    assert len(scheduler.active) == 2 and [s.request_id for s in scheduler.waiting] == ["c"]
    await scheduler.tell(Cancel(request_id="a"))
    await until(lambda: len(events.terminals()) >= 3)
    assert max(scheduler.describe()["mtp_batch"]["batch_width_histogram"]) == 2
    for actor in reversed(actors):
        await actor.close()


async def test_a_burst_of_arrivals_prefills_one_group_per_step():
    owner, events, scheduler, actors = await started("off", max_active=16)
    for i in range(12):  # more than one prefill group (8) at once
        await scheduler.tell(admitted(f"r{i}", 6))
    await until(lambda: len(events.terminals()) >= 12)
    steps = [c for c in owner.commands if c in ("PrefillChunk", "Decode")]
    assert owner.prefill_groups == [8, 4]
    # the running group decodes between the two prefills instead of waiting for both
    assert steps[:3] == ["PrefillChunk", "Decode", "PrefillChunk"]
    assert all(isinstance(e, Finished) for e in events.terminals())
    for actor in reversed(actors):
        await actor.close()


async def test_a_long_prompt_prefills_in_chunks_between_the_running_batch_steps():
    owner, events, scheduler, actors = await started("off")
    owner.step_delay = 0.001
    await scheduler.tell(admitted("a", 30))
    await until(lambda: any(isinstance(e, TokensEmitted) for e in events.of("a")))
    long = Admitted(request_id="long", prompt_ids=tuple(range(1, 4001)), submitted_at=0.0,
                    params=SamplingParams(max_tokens=4))
    await scheduler.tell(long)
    await until(lambda: len(events.terminals()) >= 2)
    assert all(isinstance(e, Finished) for e in events.terminals())
    assert owner.budgets[0] == 0  # nobody was decoding: "a" prefilled whole
    chunks = owner.budgets[1:]
    # Bounded while "a" decodes; once it has finished, the rest of the prompt runs in one go.
    assert len(chunks) >= 2 and all(0 < b <= 8192 for b in chunks[:-1]) and chunks[-1] >= 0
    # "a" kept stepping between the chunks of the long prompt
    after_first = owner.commands[owner.commands.index("PrefillChunk", 1):]
    between = after_first[:after_first.index("PrefillChunk", 1) + 1]
    assert "Decode" in between or "VerifyDrafts" in between
    for actor in reversed(actors):
        await actor.close()


async def test_cancelling_a_request_while_its_group_prefills_ends_it_once():
    owner, events, scheduler, actors = await started("off")
    owner.step_delay = 0.002
    await scheduler.tell(admitted("a", 40))
    await until(lambda: any(isinstance(e, TokensEmitted) for e in events.of("a")))
    for rid in ("x", "y"):
        await scheduler.tell(Admitted(request_id=rid, prompt_ids=tuple(range(1, 3001)), submitted_at=0.0,
                                      params=SamplingParams(max_tokens=3)))
    await until(lambda: scheduler.prefilling)
    await scheduler.tell(Cancel(request_id="x"))
    await until(lambda: len(events.terminals()) >= 3)
    done = {e.request_id: type(e).__name__ for e in events.terminals()}
    assert done == {"a": "Finished", "x": "Cancelled", "y": "Finished"}
    assert not [e for e in events.of("x") if isinstance(e, TokensEmitted)]
    assert "x" in owner.released
    for actor in reversed(actors):
        await actor.close()
