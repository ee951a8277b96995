"""Wire decoding: the request fields reach SamplingParams, bad values are refused naming the field."""

import msgspec
import pytest

from runtime.protocol import ProtocolError, decode_chat, decode_completion, decode_ws, sampling_params, ws_input

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


@pytest.mark.parametrize("body,param", [
    ({**WS, "prompt": ""}, "prompt"),
    ({"type": "generate", "id": "a"}, "messages"),
    ({**WS, "messages": [{"role": "user", "content": "x"}]}, "messages"),
    ({**WS, "prompt": None, "messages": []}, "messages"),
])
def test_a_websocket_generate_takes_exactly_one_non_empty_input(body, param):
    with pytest.raises(ProtocolError) as e:
        ws_input(decode_ws(msgspec.json.encode(body)))
    assert e.value.param == param


def test_max_tokens_range_is_checked_once_for_every_kind():
    for decode, base in KINDS:
        for bad in (0, 11):
            with pytest.raises(ProtocolError) as e:
                sampling_params(decode(msgspec.json.encode({**base, "max_tokens": bad})), max_tokens_limit=10)
            assert e.value.param == "max_tokens" and e.value.message == f"max_tokens must be in 1..10, not {bad}"
