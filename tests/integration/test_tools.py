"""tools / tool_choice through the official openai client, on the default model's weights served with
a chat template that renders tools (the model's own does not: a 400, tests/integration/test_bad_input.py):
a required or named call is constrained to a well-formed <tool_call> block, parsed into tool_calls
with finish_reason "tool_calls", whole and streamed, identical with speculation on and off; a
conversation with tool turns renders."""

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.integration.conftest import ServerProcess

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou can call these functions:\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}To call one, answer <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|im_end|>\n"
    "{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n{% if message.tool_calls %}"
    "{% for call in message.tool_calls %}<tool_call>{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments }}}</tool_call>{% endfor %}{% else %}{{ message.content }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "additionalProperties": False,
                                                          "properties": {"city": {"type": "string", "maxLength": 30}}}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools-model")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).symlink_to(Path(model_dir) / name)
    config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    proc = ServerProcess(folder.parent, extra=("--model", str(folder), "--drafter", "ngram", "--mtp-gate", "force",
                                               "--spec-cost-model", "off", "--num-draft-tokens", "3"))
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    proc.stop()


def ask(client, disable_mtp=False, **kwargs):
    return client.chat.completions.create(model="default", messages=kwargs.pop("messages", ASK), temperature=0,
                                          max_tokens=60, tools=TOOLS, extra_body={"disable_mtp": disable_mtp}, **kwargs)


def test_a_required_call_is_well_formed_and_the_same_without_speculation(client):
    reply = ask(client, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), schema)
    plain = ask(client, tool_choice="required", disable_mtp=True).choices[0].message.tool_calls[0]
    assert (plain.function.name, plain.function.arguments) == (call.function.name, call.function.arguments)


def test_a_named_call_and_its_stream(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = ask(client, tool_choice=named).choices[0].message.tool_calls[0]
    assert whole.function.name == "get_weather"
    jsonschema.validate(json.loads(whole.function.arguments), WEATHER)
    chunks = list(ask(client, tool_choice=named, stream=True))
    calls = [t for c in chunks if c.choices and c.choices[0].delta.tool_calls for t in c.choices[0].delta.tool_calls]
    assert [(t.index, t.function.name, t.function.arguments) for t in calls] == \
        [(0, "get_weather", whole.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # no call text leaks


def test_a_conversation_with_tool_turns_renders_and_auto_may_answer(client):
    arguments = json.dumps({"city": "Paris", "unit": "celsius"})
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}]
    reply = ask(client, messages=messages, tool_choice="auto")
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage.prompt_tokens > 60  # the tools and the tool turns were rendered
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.param == "tool_choice"
