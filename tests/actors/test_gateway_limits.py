"""open_request's bounds: a request with no first event within its queue wait is cancelled as
queue_timeout (one terminal event, from the scheduler); one whose streamer is gone after a failure
ends with a Failed made by the gateway; a degraded system refuses new requests at once."""

import asyncio
from types import SimpleNamespace

import pytest

from actors.admission import Admission
from actors.streamer import Streamer
from runtime.actor import Actor
from runtime.config import AdmissionConfig
from runtime.gateway import QUEUE_TIMEOUT, open_request
from runtime.messages import ActorFailure, Admitted, Cancel, Cancelled, Failed, SamplingParams, Submit, Usage
from tests.actors.fakes import CharCodec, Sink

USAGE = Usage(prompt_tokens=1, completion_tokens=0, total_tokens=1)


class SilentScheduler(Actor):
    """Holds every admitted request without a token; a Cancel ends it as Cancelled."""

    name = "scheduler"

    def __init__(self):
        super().__init__()
        self.streamer, self.cancels = None, []

    async def handle(self, msg):
        match msg:
            case Admitted():
                pass
            case Cancel():
                self.cancels.append(msg.reason)
                await self.streamer.tell(Cancelled(request_id=msg.request_id, reason=msg.reason, usage=USAGE))


async def running():
    telemetry, scheduler = Sink(), SilentScheduler()
    streamer = Streamer(None, telemetry)
    admission = Admission(AdmissionConfig(), CharCodec(), 100, scheduler, telemetry)
    scheduler.streamer, streamer.admission = streamer, admission
    actors = [telemetry, scheduler, streamer, admission]
    for actor in actors:
        actor.start()
    system = SimpleNamespace(streamer=streamer, admission=admission, scheduler=scheduler, failure=None)
    return system, actors


def submit(rid="r"):
    return Submit(request_id=rid, prompt="abc", params=SamplingParams(max_tokens=4))


async def test_a_request_that_waits_too_long_is_cancelled_once_as_queue_timeout():
    system, actors = await running()
    async with asyncio.timeout(5), open_request(system, submit(), max_wait_s=0.05) as events:
        got = [e async for e in events]
    assert [type(e) for e in got] == [Cancelled] and got[0].reason == QUEUE_TIMEOUT
    assert system.scheduler.cancels == [QUEUE_TIMEOUT]
    for actor in reversed(actors):
        await actor.close()


async def test_a_waiting_request_fails_when_the_system_failed_and_its_streamer_is_gone():
    system, actors = await running()
    async with asyncio.timeout(5), open_request(system, submit()) as events:
        system.failure = "streamer stopped: RuntimeError('boom')"
        await system.streamer.close()  # no event can reach this request any more
        got = [e async for e in events]
    assert [type(e) for e in got] == [Failed] and got[0].status == 503 and "boom" in got[0].error
    with pytest.raises(ActorFailure) as e:  # once degraded, a new request is refused at once
        async with open_request(system, submit("s")):
            pass
    assert e.value.status == 503 and "degraded" in e.value.message
    for actor in reversed(actors):
        await actor.close()
