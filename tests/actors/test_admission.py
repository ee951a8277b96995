"""Admission with a character codec: the rules that need the tokenizer or the context length."""

import pytest

from actors.admission import Admission
from runtime.actor import Rejected
from runtime.config import AdmissionConfig
from runtime.messages import ChatMessage, SamplingParams, Submit
from tests.actors.fakes import CharCodec, Collector, Sink


async def running(context_length=10, max_pending=4):
    scheduler, telemetry = Collector(), Sink()
    admission = Admission(AdmissionConfig(max_pending=max_pending), CharCodec(), context_length, scheduler, telemetry)
    actors = [scheduler, telemetry, admission]
    for actor in actors:
        actor.start()
    return admission, scheduler, actors


async def stop(actors):
    for actor in reversed(actors):
        await actor.close()


def submit(rid, prompt=None, messages=None, max_tokens=4):
    return Submit(request_id=rid, prompt=prompt, messages=messages, params=SamplingParams(max_tokens=max_tokens))


async def test_prompt_that_encodes_to_nothing_starts_from_the_start_token():
    admission, _, actors = await running()
    admitted = await admission.ask(submit("r", prompt="123 !"))  # no letters: no tokens from CharCodec
    assert admitted.prompt_ids == (0,)
    await stop(actors)


async def test_context_overflow_names_the_field_the_prompt_came_in():
    admission, _, actors = await running(context_length=5)
    with pytest.raises(Rejected) as e:
        await admission.ask(submit("p", prompt="abcdef"))
    assert e.value.param == "prompt"
    with pytest.raises(Rejected) as e:
        await admission.ask(submit("m", messages=(ChatMessage(role="user", content="abcdef"),)))
    assert e.value.param == "messages"
    await stop(actors)


async def test_max_tokens_is_cut_to_the_room_left_and_the_pending_limit_holds():
    admission, scheduler, actors = await running(context_length=10, max_pending=1)
    admitted = await admission.ask(submit("a", prompt="abcdefg", max_tokens=8))
    assert admitted.params.max_tokens == 3  # ends with finish_reason "length"
    with pytest.raises(Rejected) as e:
        await admission.ask(submit("b", prompt="abc"))
    assert e.value.status == 429
    await stop(actors)
