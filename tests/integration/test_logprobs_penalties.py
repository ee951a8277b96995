"""logprobs / top_logprobs and the penalties through the official openai client, on servers forced
to speculate (serial with n-gram drafts, mtp_batch with the shipped MTP head): each answer, streamed
or not, equals the same request with speculation off (disable_mtp), log-probabilities within float
tolerance."""

import openai
import pytest

from tests.integration.conftest import ServerProcess

CHAT = [{"role": "user", "content": "List the numbers one to ten, then again, in words."}]
PROMPT = "one two three four, one two three four, one two three four,"
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
PENALTIES = dict(presence_penalty=0.3, frequency_penalty=0.2, extra_body={"repetition_penalty": 1.05})


@pytest.fixture(scope="module", params=[("serial", "ngram"), ("mtp_batch", "mtp")], ids=["serial", "mtp_batch"])
def client(request, model_dir, tmp_path_factory):
    mode, drafter = request.param
    proc = ServerProcess(tmp_path_factory.mktemp(mode), extra=(
        "--scheduler-mode", mode, "--drafter", drafter, "--mtp-gate", "force", "--spec-cost-model", "off",
        "--num-draft-tokens", "3"))
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    proc.stop()


def both(call, **kwargs):
    """The same request with speculation on and off."""
    extra = kwargs.pop("extra_body", {})
    return call(**kwargs, extra_body=extra), call(**kwargs, extra_body={**extra, "disable_mtp": True})


def assert_same_logprobs(a, b):
    assert [t.token for t in a] == [t.token for t in b]
    for x, y in zip(a, b):
        assert x.logprob == pytest.approx(y.logprob, abs=2e-3)
        assert [t.token for t in x.top_logprobs] == [t.token for t in y.top_logprobs]
        assert [t.logprob for t in x.top_logprobs] == pytest.approx([t.logprob for t in y.top_logprobs], abs=2e-3)


def test_chat_logprobs_are_the_same_with_and_without_speculation(client):
    on, off = both(client.chat.completions.create, model="default", messages=CHAT, temperature=0, max_tokens=32,
                   logprobs=True, top_logprobs=3)
    assert on.choices[0].message.content == off.choices[0].message.content
    assert on.usage.model_extra["speculation"]["drafted_tokens"] > 0
    assert off.usage.model_extra["speculation"]["drafted_tokens"] == 0
    content = on.choices[0].logprobs.content
    assert len(content) == on.usage.completion_tokens
    assert "".join(t.token for t in content) == on.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)
    assert bytes(b for t in content for b in t.bytes).decode() == on.choices[0].message.content
    assert_same_logprobs(content, off.choices[0].logprobs.content)


def test_streamed_chat_logprobs_equal_the_whole_answers(client):
    whole = client.chat.completions.create(model="default", messages=CHAT, temperature=0, max_tokens=20,
                                           logprobs=True, top_logprobs=2)
    chunks = list(client.chat.completions.create(model="default", messages=CHAT, temperature=0, max_tokens=20,
                                                 logprobs=True, top_logprobs=2, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert_same_logprobs(streamed, whole.choices[0].logprobs.content)


def test_completion_logprobs_legacy_form(client):
    on, off = both(client.completions.create, model="default", prompt=PROMPT, temperature=0, max_tokens=16,
                   logprobs=2)
    assert on.choices[0].text == off.choices[0].text
    lp, lp_off = on.choices[0].logprobs, off.choices[0].logprobs
    assert "".join(lp.tokens) == on.choices[0].text and lp.tokens == lp_off.tokens
    assert lp.token_logprobs == pytest.approx(lp_off.token_logprobs, abs=2e-3)
    assert all(len(top) == 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    streamed = client.completions.create(model="default", prompt=PROMPT, temperature=0, max_tokens=16, logprobs=2,
                                         stream=True)
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


def test_penalties_change_greedy_output_identically_with_and_without_speculation(client):
    plain = client.completions.create(model="default", prompt=CODE, temperature=0, max_tokens=40)
    on, off = both(client.completions.create, model="default", prompt=CODE, temperature=0, max_tokens=40,
                   **PENALTIES)
    assert on.choices[0].text == off.choices[0].text != plain.choices[0].text
    assert on.usage.model_extra["speculation"]["drafted_tokens"] > 0
    chat_on, chat_off = both(client.chat.completions.create, model="default", messages=CHAT, temperature=0,
                             max_tokens=24, stream=False, **PENALTIES)
    assert chat_on.choices[0].message.content == chat_off.choices[0].message.content


def test_paced_streams_carry_the_same_tokens_one_per_chunk(client):
    kwargs = dict(model="default", messages=CHAT, temperature=0, max_tokens=48, stream=True, logprobs=True)
    paced = [c for c in client.chat.completions.create(**kwargs, extra_body={"stream_pacing": True}) if c.choices]
    plain = [c for c in client.chat.completions.create(**kwargs, extra_body={"stream_pacing": False}) if c.choices]
    tokens = [[t.token for t in c.choices[0].logprobs.content] for c in paced if c.choices[0].logprobs]
    assert all(len(t) == 1 for t in tokens)  # each burst split into one chunk per token
    assert sum(tokens, []) == [t.token for c in plain if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert "".join(c.choices[0].delta.content or "" for c in paced) == \
        "".join(c.choices[0].delta.content or "" for c in plain)
    assert any(len(c.choices[0].logprobs.content) > 1 for c in plain if c.choices[0].logprobs)  # it did burst


def test_logit_bias_bans_and_favours_tokens_alike_with_and_without_speculation(client):
    plain = client.completions.create(model="default", prompt=CODE, temperature=0, max_tokens=12, logprobs=0)
    first = plain.choices[0].logprobs.tokens[0]
    banned = tokenizer_id(first)
    on, off = both(client.completions.create, model="default", prompt=CODE, temperature=0, max_tokens=12,
                   logit_bias={str(banned): -100})
    assert on.choices[0].text == off.choices[0].text != plain.choices[0].text
    assert not on.choices[0].text.startswith(first)
    assert on.usage.model_extra["speculation"]["drafted_tokens"] > 0
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="default", prompt=CODE, max_tokens=2, logit_bias={"10000000": 5})
    assert bad.value.body["param"] == "logit_bias"


def tokenizer_id(text: str) -> int:
    from transformers import AutoTokenizer

    from kernels.default_model import default_model_dir

    ids = AutoTokenizer.from_pretrained(str(default_model_dir())).encode(text, add_special_tokens=False)
    assert len(ids) == 1
    return ids[0]
