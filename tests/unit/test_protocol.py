"""Wire decoding: the request fields reach SamplingParams, bad values are refused naming the field."""

import msgspec
import pytest

from runtime.protocol import ProtocolError, decode_chat, decode_completion, decode_ws, sampling_params

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"prompt": "Hi"}
WS = {"type": "generate", "id": "a", "prompt": "Hi"}
KINDS = [(decode_chat, CHAT), (decode_completion, COMPLETION), (decode_ws, WS)]


def params_of(decode, body: dict):
    return sampling_params(decode(msgspec.json.encode(body)))


@pytest.mark.parametrize("decode,base", KINDS, ids=["chat", "completion", "ws"])
def test_objective_user_and_conversation_reach_the_params(decode, base):
    assert params_of(decode, base).objective == "balanced"
    assert params_of(decode, base).conversation is None
    for objective in ("latency", "energy", "balanced"):
        assert params_of(decode, {**base, "objective": objective}).objective == objective
    assert params_of(decode, {**base, "user": "u1"}).conversation == "u1"
    both = params_of(decode, {**base, "user": "u1", "conversation_id": "c1"})
    assert both.conversation == "c1"  # the conversation id wins over the user


@pytest.mark.parametrize("decode,base", KINDS, ids=["chat", "completion", "ws"])
@pytest.mark.parametrize("field,value", [("objective", "fast"), ("objective", 3), ("user", 5),
                                         ("conversation_id", ["x"])])
def test_a_bad_value_is_a_400_naming_its_field(decode, base, field, value):
    with pytest.raises(ProtocolError) as e:
        params_of(decode, {**base, field: value})
    assert e.value.status == 400 and e.value.param == field
