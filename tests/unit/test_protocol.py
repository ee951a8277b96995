"""Wire decoding: the request fields reach SamplingParams, bad values are refused naming the field."""

import msgspec
import pytest

from runtime.protocol import (
    ProtocolError, chat_messages, check_model, decode_chat, decode_completion, decode_ws, sampling_params, ws_input,
)

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


# --- no silent ignores: every OpenAI field is declared; honoured, or refused unless neutral -----

def openai_fields(kind: str) -> set[str]:
    """The request fields the official openai client can send (its own TypedDicts)."""
    from openai.types import completion_create_params as completion
    from openai.types.chat import completion_create_params as chat

    module = chat if kind == "chat" else completion
    return set(module.CompletionCreateParamsBase.__annotations__) | {"stream"}


@pytest.mark.parametrize("kind,cls", [("chat", "ChatRequest"), ("completion", "CompletionRequest")])
def test_every_field_of_the_openai_client_is_declared(kind, cls):
    import runtime.protocol as protocol

    declared = set(getattr(protocol, cls).__struct_fields__)
    assert openai_fields(kind) <= declared, openai_fields(kind) - declared


@pytest.mark.parametrize("field,value", [
    ("functions", [{"name": "f"}]), ("function_call", "auto_call"),
    ("prediction", {"type": "content"}), ("store", True),
    ("reasoning_effort", "high"), ("modalities", ["text", "audio"]), ("service_tier", "flex"),
    ("parallel_tool_calls", False),
])
def test_an_unsupported_field_that_asks_for_something_is_a_400_naming_it(field, value):
    with pytest.raises(ProtocolError) as e:
        decode_chat(msgspec.json.encode({**CHAT, field: value}))
    assert e.value.status == 400 and e.value.param == field and "not supported" in e.value.message


def test_neutral_values_of_unsupported_fields_are_accepted():
    neutral = {"logprobs": False, "top_logprobs": 0, "response_format": {"type": "text"}, "tools": [],
               "tool_choice": "none", "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
               "store": False, "service_tier": "auto", "parallel_tool_calls": True, "n": 1,
               "stream_options": {"include_usage": True, "include_obfuscation": False}}
    decode_chat(msgspec.json.encode({**CHAT, **neutral}))
    decode_completion(msgspec.json.encode({**COMPLETION, "best_of": 1, "suffix": "", "echo": True}))


@pytest.mark.parametrize("body,param", [
    ({**CHAT, "top_k": 5}, "top_k"),  # another server's extra: refused, not ignored
    ({"messages": [{"role": "user", "content": "x", "weight": 1}]}, "messages[0].weight"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
    ({"messages": [{"role": "assistant", "content": "x", "function_call": {"name": "f"}}]},
     "messages[0].function_call"),
    ({**CHAT, "stream_options": {"include_usage": True, "chunk": 1}}, "stream_options.chunk"),
])
def test_unknown_and_unsupported_nested_fields_are_named(body, param):
    with pytest.raises(ProtocolError) as e:
        decode_chat(msgspec.json.encode(body))
    assert e.value.param == param, e.value.message


def test_logprobs_and_penalties_reach_the_sampling_params():
    chat = decode_chat(msgspec.json.encode({**CHAT, "logprobs": True, "top_logprobs": 3, "presence_penalty": 0.5,
                                            "frequency_penalty": -1.0, "repetition_penalty": 1.2}))
    p = sampling_params(chat)
    assert (p.logprobs, p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (3, 0.5, -1.0, 1.2)
    assert sampling_params(decode_chat(msgspec.json.encode({**CHAT, "logprobs": True}))).logprobs == 0
    assert sampling_params(decode_chat(msgspec.json.encode(CHAT))).logprobs is None
    # completions: logprobs 0 asks for the chosen token's log-probability only
    assert sampling_params(decode_completion(msgspec.json.encode({**COMPLETION, "logprobs": 0}))).logprobs == 0
    assert sampling_params(decode_chat(msgspec.json.encode({**CHAT, "top_logprobs": 2}))).logprobs == 2
    with pytest.raises(ProtocolError) as e:
        sampling_params(decode_chat(msgspec.json.encode({**CHAT, "logprobs": False, "top_logprobs": 2})))
    assert e.value.param == "top_logprobs"


def test_non_text_content_parts_are_refused():
    image = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "image_url": {"url": "u"}}]}]}
    with pytest.raises(ProtocolError) as e:
        chat_messages(decode_chat(msgspec.json.encode(image)).messages)
    assert e.value.param == "messages[0].content"


def test_a_model_this_server_does_not_serve_is_a_404():
    check_model(None, "m")
    check_model("m", "m")
    check_model("default", "m")
    with pytest.raises(ProtocolError) as e:
        check_model("gpt-4o", "m")
    assert e.value.status == 404 and e.value.param == "model"


def test_seeds_of_any_int64_reach_the_params_and_zero_max_completion_tokens_is_refused():
    assert params_of(decode_chat, {**CHAT, "seed": -1}).seed == (1 << 63) - 1
    assert params_of(decode_chat, {**CHAT, "seed": 7}).seed == 7
    with pytest.raises(ProtocolError):
        params_of(decode_chat, {**CHAT, "max_completion_tokens": 0})
    assert params_of(decode_chat, {**CHAT, "prompt_cache_key": "k"}).conversation == "k"
