"""The scheduler's speculative step with the real drafter (n-gram) and verifier actors."""

import asyncio

from actors.drafter import Drafter
from actors.scheduler import Scheduler
from actors.verifier import Verifier
from runtime.messages import Admitted, Failed, Finished, SamplingParams, TokensEmitted
from runtime.modes import SerialMode
from runtime.speculation import SpeculationPolicy
from tests.unit.test_speculation_policy import controlled
from tests.actors.fakes import CharCodec, Collector, ScriptedSpecOwner, Sink

SCRIPT = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 3]


async def run_one(params: SamplingParams, owner=None, table=None):
    owner = owner or ScriptedSpecOwner({"r": SCRIPT})
    streamer, telemetry = Collector(), Sink()
    drafter, verifier = Drafter("ngram", owner, telemetry), Verifier(owner, telemetry)
    policy = controlled("force", table) if table is not None else SpeculationPolicy("ngram", 3, "force")
    scheduler = Scheduler(SerialMode(), owner, streamer, telemetry, CharCodec(), policy, drafter, verifier)
    actors = [owner, streamer, telemetry, drafter, verifier, scheduler]
    for actor in actors:
        actor.start()
    await scheduler.tell(Admitted(request_id="r", prompt_ids=(1, 2, 3), params=params, submitted_at=0.0))
    async with asyncio.timeout(5):
        await streamer.terminal.wait()
    for actor in reversed(actors):
        await actor.close()
    return owner, streamer


async def test_speculative_steps_emit_the_script_with_a_receipt():
    owner, events = await run_one(SamplingParams(max_tokens=len(SCRIPT)))
    tokens = [t for e in events.of("r") if isinstance(e, TokensEmitted) for t in e.token_ids]
    assert tokens == SCRIPT
    done = events.terminals()[0]
    assert isinstance(done, Finished) and done.finish_reason == "length"
    receipt = done.usage.speculation
    assert receipt.verify_steps == len(owner.rollbacks) > 0
    assert receipt.accepted_tokens == sum(r.accepted for r in owner.rollbacks) > 0
    assert receipt.drafted_tokens == sum(r.drafted for r in owner.rollbacks)
    assert all(a <= d for a, d in zip(receipt.accepted_by_position, receipt.drafted_by_position, strict=True))
    assert all(r.drafted <= 3 for r in owner.rollbacks)


async def test_disable_mtp_keeps_the_request_on_plain_decode():
    owner, events = await run_one(SamplingParams(max_tokens=10, disable_mtp=True))
    receipt = events.terminals()[0].usage.speculation
    assert receipt.verify_steps == 0 and owner.rollbacks == []


async def test_a_failing_verification_fails_only_that_request():
    class Broken(ScriptedSpecOwner):
        async def handle(self, msg):
            from runtime.owner_messages import VerifyDrafts

            if isinstance(msg, VerifyDrafts):
                raise RuntimeError("verify exploded")
            return await super().handle(msg)

    _, events = await run_one(SamplingParams(max_tokens=10), Broken({"r": SCRIPT}))
    assert isinstance(events.terminals()[0], Failed)
    assert "verify exploded" in events.terminals()[0].error


async def test_the_planner_decides_depth_inside_the_scheduler():
    from tests.unit.test_speculation_policy import _table  # noqa: F811

    _, dear = await run_one(SamplingParams(max_tokens=len(SCRIPT)), table=_table([10, 20, 30, 40], 0.1))
    assert dear.terminals()[0].usage.speculation.verify_steps == 0  # depth 0: plain steps only
    owner, cheap = await run_one(SamplingParams(max_tokens=len(SCRIPT)), table=_table([10, 11, 12, 13], 0.9))
    tokens = [t for e in cheap.of("r") if isinstance(e, TokensEmitted) for t in e.token_ids]
    assert tokens == SCRIPT and cheap.terminals()[0].usage.speculation.verify_steps > 0
