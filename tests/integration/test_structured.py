"""response_format through the official openai client, on servers forced to speculate in each
scheduler mode (serial with n-gram drafts, mtp_batch with the shipped MTP head, hyper: its serial
chain verify, which such requests take): every answer parses and validates against its schema with
jsonschema, and greedy answers equal the same request with speculation off, whole and streamed."""

import json

import jsonschema
import openai
import pytest

from tests.integration.conftest import ServerProcess

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "languages"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "languages": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                       "maxItems": 3}}}
ASK = [{"role": "user", "content": "Describe a famous programmer as JSON with name, age and languages."}]
MODES = {"serial": ("--scheduler-mode", "serial", "--drafter", "ngram", "--mtp-gate", "force",
                    "--spec-cost-model", "off", "--num-draft-tokens", "3"),
         "mtp_batch": ("--scheduler-mode", "mtp_batch", "--drafter", "mtp", "--mtp-gate", "force",
                       "--spec-cost-model", "off", "--num-draft-tokens", "3"),
         "hyper": ("--scheduler-mode", "hyper", "--mtp-gate", "force", "--spec-cost-model", "off",
                   "--num-draft-tokens", "3")}


@pytest.fixture(scope="module", params=list(MODES))
def client(request, model_dir, tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp(request.param), extra=MODES[request.param])
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", timeout=180, max_retries=0)
    proc.stop()


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def ask(client, fmt, disable_mtp=False, **kwargs):
    return client.chat.completions.create(model="default", messages=ASK, temperature=0, max_tokens=80,
                                          response_format=fmt, extra_body={"disable_mtp": disable_mtp}, **kwargs)


def test_a_json_schema_answer_validates_and_equals_plain_decode(client):
    on, off = ask(client, schema_format(PERSON)), ask(client, schema_format(PERSON), disable_mtp=True)
    assert on.choices[0].finish_reason == "stop"
    answer = json.loads(on.choices[0].message.content)
    jsonschema.validate(answer, PERSON)
    assert on.choices[0].message.content == off.choices[0].message.content
    receipt = off.usage.model_extra["speculation"]
    assert receipt["drafted_tokens"] == 0
    # plain decode takes the grammar's forced runs in one forward each: fewer steps than tokens
    assert receipt["forced_tokens"] > 0
    assert receipt["plain_steps"] + receipt["verify_steps"] < off.usage.completion_tokens - 1
    assert on.usage.model_extra["speculation"]["drafted_tokens"] > 0
    chunks = ask(client, schema_format(PERSON), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == on.choices[0].message.content


def test_json_object_mode_gives_an_object(client):
    reply = ask(client, {"type": "json_object"}, max_completion_tokens=60)
    if reply.choices[0].finish_reason == "stop":  # a length cut leaves unfinished JSON, as OpenAI's does
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:
        assert reply.choices[0].message.content.startswith("{")


def test_sampled_answers_validate_too(client):
    for seed in (1, 2):
        reply = client.chat.completions.create(model="default", messages=ASK, temperature=0.8, seed=seed,
                                               max_tokens=80, response_format=schema_format(PERSON))
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)


def test_completions_take_response_format(client):
    reply = client.completions.create(model="default", prompt="A person as JSON: ", temperature=0, max_tokens=80,
                                      extra_body={"response_format": schema_format(PERSON)})
    jsonschema.validate(json.loads(reply.choices[0].text), PERSON)
