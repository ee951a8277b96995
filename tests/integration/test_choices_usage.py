"""n > 1 and stream_options.include_usage through the official openai client, and the speculation
receipt in usage.completion_tokens_details."""

import openai
import pytest

CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture
def client(idle_server):
    return openai.OpenAI(base_url=idle_server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_several_choices_whole_and_streamed(client):
    kwargs = dict(model="default", messages=CHAT, temperature=1.0, max_tokens=8, seed=5, n=3)
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) > 1  # each choice samples with its own seed
    assert client.chat.completions.create(**kwargs).choices[2].message.content == texts[2]  # reproducible
    alone = client.chat.completions.create(**{**kwargs, "n": 1, "seed": 6})
    assert alone.choices[0].message.content == texts[1]  # choice i is the request with seed + i
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(3)]
    assert streamed == texts
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 3
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.prompt_tokens == alone.usage.prompt_tokens  # the prompt is counted once


def test_completions_with_several_choices(client):
    reply = client.completions.create(model="default", prompt="def add(a, b):", temperature=0, max_tokens=6, n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].text == reply.choices[1].text  # greedy: the same answer twice
    assert reply.usage.completion_tokens == 12


def test_the_receipt_is_in_completion_tokens_details(client):
    reply = client.chat.completions.create(model="default", messages=CHAT, temperature=0, max_tokens=8)
    details = reply.usage.completion_tokens_details
    receipt = details.model_extra["speculation"]
    assert receipt == reply.usage.model_extra["speculation"]
    assert details.accepted_prediction_tokens == receipt["accepted_tokens"]
    assert details.rejected_prediction_tokens == receipt["drafted_tokens"] - receipt["accepted_tokens"]
