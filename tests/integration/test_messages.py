"""Anthropic-style /v1/messages through the official anthropic client: JSON and the SSE event
stream, system prompts, stop sequences, errors in Anthropic's shape, and the same text as the
OpenAI endpoint gives for the same conversation."""

import anthropic
import openai
import pytest

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # this client version has no temperature argument: sent as an extra body field


@pytest.fixture
def client(idle_server):
    return anthropic.Anthropic(base_url=idle_server.url, api_key="unused", timeout=60, max_retries=0)


def test_a_message_and_its_stream(client, idle_server):
    reply = client.messages.create(model="default", max_tokens=32, messages=CAPITAL, extra_body=GREEDY)
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.content[0].text == "The capital of France is Paris."
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens == 7
    with client.messages.stream(model="default", max_tokens=32, messages=CAPITAL, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == reply.content[0].text == final.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 7
    assert final.usage.input_tokens == reply.usage.input_tokens
    oa = openai.OpenAI(base_url=idle_server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
    assert oa.chat.completions.create(model="default", messages=CAPITAL, temperature=0).choices[0].message.content \
        == text


def test_system_prompt_stop_sequences_and_max_tokens(client):
    stopped = client.messages.create(model="default", max_tokens=32, messages=CAPITAL, extra_body=GREEDY,
                                     stop_sequences=[" is"])
    assert stopped.content[0].text == "The capital of France"
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " is"
    cut = client.messages.create(model="default", max_tokens=3, messages=CAPITAL, extra_body=GREEDY,
                                 system="You answer in one word.")
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    text_blocks = [{"role": "user", "content": [{"type": "text", "text": CAPITAL[0]["content"]}]}]
    blocks = client.messages.create(model="default", max_tokens=32, extra_body=GREEDY, messages=text_blocks)
    assert blocks.content[0].text == "The capital of France is Paris."


def test_refusals_come_in_anthropics_error_shape(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="default", max_tokens=8, messages=CAPITAL,
                               tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert e.value.body["type"] == "error" and "tools" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-3-opus", max_tokens=8, messages=CAPITAL)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="default", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "AAAA"}}]}])
