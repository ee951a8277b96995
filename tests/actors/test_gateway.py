"""open_request with the real streamer and admission: one message to subscribe, one terminal event."""

import asyncio
from types import SimpleNamespace

import pytest

from actors.admission import Admission
from actors.streamer import Streamer
from runtime.actor import Actor, Rejected
from runtime.config import AdmissionConfig
from runtime.gateway import open_request
from runtime.messages import (
    Admitted, Cancel, Cancelled, Finished, SamplingParams, Submit, TokensEmitted, Usage,
)
from tests.actors.fakes import CharCodec, Sink

USAGE = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)


class EagerScheduler(Actor):
    """Emits a token and Finished the moment a request is admitted; a Cancel ends it as Cancelled."""

    name = "scheduler"

    def __init__(self, finish: bool = True):
        super().__init__()
        self.streamer, self.finish = None, finish
        self.cancels: list[str] = []

    async def handle(self, msg):
        match msg:
            case Admitted():
                await self.streamer.tell(TokensEmitted(request_id=msg.request_id, token_ids=(1,), text="a", index=0))
                if self.finish:
                    await self.streamer.tell(Finished(request_id=msg.request_id, finish_reason="stop", usage=USAGE))
            case Cancel():
                self.cancels.append(msg.request_id)
                await self.streamer.tell(Cancelled(request_id=msg.request_id, reason=msg.reason, usage=USAGE))


async def running(finish=True):
    telemetry, scheduler = Sink(), EagerScheduler(finish)
    streamer = Streamer(None, telemetry)
    admission = Admission(AdmissionConfig(max_pending=2), CharCodec(), 100, scheduler, telemetry)
    scheduler.streamer, streamer.admission = streamer, admission
    actors = [telemetry, scheduler, streamer, admission]
    for actor in actors:
        actor.start()
    return SimpleNamespace(streamer=streamer, admission=admission, scheduler=scheduler), actors


async def stop(actors):
    for actor in reversed(actors):
        await actor.close()


def submit(rid, prompt="abc"):
    return Submit(request_id=rid, prompt=prompt, params=SamplingParams(max_tokens=4))


async def test_events_emitted_at_once_after_admission_all_reach_the_client():
    system, actors = await running()
    async with open_request(system, submit("r")) as events:
        got = [e async for e in events]
    assert [type(e) for e in got] == [TokensEmitted, Finished]
    await asyncio.sleep(0.01)
    assert system.streamer.subscribers == {} and system.admission.pending == set()
    await stop(actors)


async def test_a_rejected_request_leaves_no_subscription():
    system, actors = await running()
    with pytest.raises(Rejected):
        async with open_request(system, submit("r", prompt="a" * 150)):  # beyond the context of 100
            pass
    await asyncio.sleep(0.01)
    assert system.streamer.subscribers == {}
    await stop(actors)


async def test_a_caller_leaving_early_cancels_and_the_request_still_ends_once():
    system, actors = await running(finish=False)
    async with open_request(system, submit("r")) as events:
        async for event in events:
            assert isinstance(event, TokensEmitted)
            break
    await asyncio.sleep(0.02)
    assert system.scheduler.cancels == ["r"]
    assert system.streamer.ended == {"r"} and system.streamer.subscribers == {}
    assert system.admission.pending == set()  # the terminal event freed the slot
    await stop(actors)
