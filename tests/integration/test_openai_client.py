"""The official openai client against the real server and the default model."""

import openai
import pytest

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(idle_server):
    return openai.OpenAI(base_url=idle_server.url + "/v1", api_key="unused", timeout=60, max_retries=0)


def test_known_answer_from_a_correct_conversion(client):
    reply = client.chat.completions.create(model="default", messages=CAPITAL, temperature=0)
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens == 7
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 7


def test_chat_stream_matches_the_whole_answer(client):
    chunks = list(client.chat.completions.create(model="default", messages=CAPITAL, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_whole_and_streamed(client):
    whole = client.completions.create(model="default", prompt="def add(a, b):", max_tokens=12, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    streamed = client.completions.create(model="default", prompt="def add(a, b):", max_tokens=12,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text


def test_stop_sequences_and_seeded_sampling(client):
    stopped = client.chat.completions.create(model="default", messages=CAPITAL, temperature=0, stop=[" is"])
    assert stopped.choices[0].message.content == "The capital of France"
    assert stopped.choices[0].finish_reason == "stop"
    kwargs = dict(model="default", messages=CAPITAL, temperature=0.9, top_p=0.95, max_tokens=16, seed=1234)
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == first


def test_models_list(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct-f32"]


def test_speculation_receipt_is_in_usage(client):
    reply = client.chat.completions.create(model="default", messages=CAPITAL, temperature=0, max_tokens=4)
    receipt = reply.usage.model_extra["speculation"]
    assert set(receipt) >= {"drafted_tokens", "accepted_tokens", "accepted_by_position", "verify_seconds"}
    # The prefill emits one token, a plain step one, a verify step its accepted drafts plus one
    # (the last step may emit past max_tokens).
    emitted = 1 + receipt["plain_steps"] + receipt["verify_steps"] + receipt["accepted_tokens"]
    assert emitted >= reply.usage.completion_tokens == 4
    assert sum(receipt["accepted_by_position"]) == receipt["accepted_tokens"] <= receipt["drafted_tokens"]
