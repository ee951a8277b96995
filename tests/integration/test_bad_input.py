"""Bad input gets a 4xx with an OpenAI-style error naming the problem; the server keeps serving."""

import aiohttp
import pytest

GOOD = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
CASES = [
    ("malformed json", b"{not json", 400, None),
    ("wrong type", {**GOOD, "max_tokens": "many"}, 400, "max_tokens"),
    ("unknown role", {**GOOD, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("max_tokens zero", {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens huge", {**GOOD, "max_tokens": 10**9}, 400, "max_tokens"),
    ("empty messages", {**GOOD, "messages": []}, 400, "messages"),
    ("missing messages", {"max_tokens": 2}, 400, None),
    ("temperature out of range", {**GOOD, "temperature": 7}, 400, "temperature"),
    ("n above eight", {**GOOD, "n": 9}, 400, "n"),
    ("unknown objective", {**GOOD, "objective": "fast"}, 400, "objective"),
    ("prompt longer than the context", {**GOOD, "messages": [{"role": "user", "content": "hello " * 9000}]}, 400, "messages"),
    ("oversized body", {**GOOD, "messages": [{"role": "user", "content": "x" * 2_000_000}]}, 413, None),
    # OpenAI fields this server does not implement: refused, never a silent 200.
    ("logit bias past the vocabulary", {**GOOD, "logit_bias": {"99999999": 2.0}}, 400, "logit_bias"),
    ("logit bias keyed by text", {**GOOD, "logit_bias": {"hello": 2.0}}, 400, "logit_bias"),
    ("logit bias above 100", {**GOOD, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("top_logprobs with logprobs false", {**GOOD, "logprobs": False, "top_logprobs": 3}, 400, "top_logprobs"),
    ("top_logprobs above 20", {**GOOD, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("unknown response format", {**GOOD, "response_format": {"type": "xml"}}, 400, "response_format.type"),
    ("schema that is no schema", {**GOOD, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, 400, "response_format.json_schema.schema"),
    ("tools", {**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("penalty out of range", {**GOOD, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("repetition penalty zero", {**GOOD, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("unknown field", {**GOOD, "top_k": 40}, 400, "top_k"),
    ("unknown model", {**GOOD, "model": "gpt-4o"}, 404, "model"),
]


@pytest.mark.parametrize("name,body,status,param", CASES, ids=[c[0] for c in CASES])
async def test_bad_chat_request_is_refused_clearly(idle_server, name, body, status, param):
    async with aiohttp.ClientSession() as http:
        kwargs = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {"json": body}
        async with http.post(idle_server.url + "/v1/chat/completions", **kwargs) as r:
            assert r.status == status
            error = (await r.json())["error"]
            assert error["message"] and error["type"] and error["code"] == status
            if param:
                assert error["param"] == param
        async with http.post(idle_server.url + "/v1/chat/completions", json=GOOD) as r:
            assert r.status == 200  # the next request is served


async def test_objective_user_and_conversation_id_are_accepted(idle_server):
    extra = [{"objective": "latency"}, {"objective": "energy"}, {"user": "u1"}, {"conversation_id": "c1"}]
    async with aiohttp.ClientSession() as http:
        for fields in extra:
            async with http.post(idle_server.url + "/v1/chat/completions", json=GOOD | fields) as r:
                assert r.status == 200, await r.text()
            async with http.post(idle_server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2} | fields) as r:
                assert r.status == 200, await r.text()


async def test_unknown_route_and_bad_completion_prompt(idle_server):
    async with aiohttp.ClientSession() as http:
        async with http.get(idle_server.url + "/v1/nothing") as r:
            assert r.status == 404 and "error" in await r.json()
        async with http.post(idle_server.url + "/v1/completions", json={"prompt": "", "max_tokens": 2}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "prompt"


async def test_queue_full_gets_429_and_disconnects_free_the_slots(idle_server):
    from tests.integration.conftest import MAX_PENDING

    long = {**GOOD, "max_tokens": 2000, "stream": True}
    cancelled = idle_server.counter("requests_total{outcome=cancelled}")  # earlier tests' count
    async with aiohttp.ClientSession() as http:
        streams = [await http.post(idle_server.url + "/v1/chat/completions", json=long) for _ in range(MAX_PENDING)]
        assert all(s.status == 200 for s in streams)
        async with http.post(idle_server.url + "/v1/chat/completions", json=GOOD) as r:
            assert r.status == 429 and r.headers["Retry-After"] == "1"
            assert (await r.json())["error"]["type"] == "rate_limit_error"
        for s in streams:
            s.close()  # client disconnects mid-stream: each request is cancelled, its slot freed
    assert await eventually_served(idle_server.url, GOOD)
    assert idle_server.counter("requests_total{outcome=cancelled}") - cancelled == MAX_PENDING


async def eventually_served(url: str, body: dict, tries: int = 50) -> bool:
    """Slots free once the server notices the disconnects, a moment after the client closes."""
    import asyncio

    async with aiohttp.ClientSession() as http:
        for _ in range(tries):
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                if r.status == 200:
                    return True
                assert r.status == 429
            await asyncio.sleep(0.2)
    return False


def test_the_official_client_learns_which_field_was_refused(idle_server):
    import openai

    client = openai.OpenAI(base_url=idle_server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
    calls = {"prediction": {"prediction": {"type": "content", "content": "x"}},
             "tools": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}}
    for field, kwargs in calls.items():
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="default", messages=GOOD["messages"], max_tokens=2, **kwargs)
        assert e.value.param == field and "not supported" in e.value.message


async def test_include_usage_echo_and_the_document(idle_server):
    async with aiohttp.ClientSession() as http:
        body = {**GOOD, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post(idle_server.url + "/v1/chat/completions", json=body) as r:
            events = [line async for line in r.content if line.startswith(b"data: ")]
        import json

        *chunks, done = events
        last = json.loads(chunks[-1][6:])
        assert done.strip() == b"data: [DONE]" and last["choices"] == [] and last["usage"]["completion_tokens"] == 2
        assert all(json.loads(c[6:])["usage"] is None for c in chunks[:-1])
        async with http.post(idle_server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "echo": True}) as r:
            assert (await r.json())["choices"][0]["text"].startswith("Hi")
        async with http.get(idle_server.url + "/openapi.json") as r:
            doc = await r.json()
        assert doc["openapi"].startswith("3.1") and "/v1/chat/completions" in doc["paths"]
