"""WebSocket streaming: several requests on one socket, cancel, usage, disconnect frees the slot."""

import asyncio
import time

import aiohttp
import pytest

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


async def collect(ws, ids: set[str], timeout: float = 60.0) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {i: [] for i in ids}
    open_ids = set(ids)
    async with asyncio.timeout(timeout):
        while open_ids:
            msg = await ws.receive_json()
            out[msg["id"]].append(msg)
            if msg["type"] in ("done", "error"):
                open_ids.discard(msg["id"])
    return out


async def test_two_requests_share_one_socket(idle_server):
    async with aiohttp.ClientSession() as http, http.ws_connect(idle_server.url + "/v1/ws") as ws:
        await ws.send_json({"type": "generate", "id": "a", "messages": CAPITAL, "temperature": 0})
        await ws.send_json({"type": "generate", "id": "b", "prompt": "def add(a, b):", "max_tokens": 8,
                            "temperature": 0})
        got = await collect(ws, {"a", "b"})
    a_text = "".join(m["text"] for m in got["a"] if m["type"] == "tokens")
    assert a_text == "The capital of France is Paris."
    assert got["a"][-1]["finish_reason"] == "stop"
    assert got["b"][-1]["finish_reason"] == "length" and got["b"][-1]["usage"]["completion_tokens"] == 8
    assert "speculation" in got["b"][-1]["usage"]
    # A speculative step sends several tokens in one message; index is the first one's position.
    tokens = [m for m in got["b"] if m["type"] == "tokens"]
    ids = [t for m in tokens for t in m["token_ids"]]
    assert len(ids) == 8
    assert [m["index"] for m in tokens] == [sum(len(m["token_ids"]) for m in tokens[:i]) for i in range(len(tokens))]


async def test_cancel_one_request_by_id(idle_server):
    async with aiohttp.ClientSession() as http, http.ws_connect(idle_server.url + "/v1/ws") as ws:
        await ws.send_json({"type": "generate", "id": "long", "prompt": "Once upon a time", "max_tokens": 2000})
        first = await ws.receive_json()
        assert first["type"] == "tokens"
        await ws.send_json({"type": "cancel", "id": "long"})
        got = await collect(ws, {"long"})
    assert got["long"][-1]["type"] == "done" and got["long"][-1]["finish_reason"] == "cancelled"
    assert got["long"][-1]["usage"]["completion_tokens"] < 2000


async def test_bad_message_gets_an_error_and_the_socket_stays_open(idle_server):
    async with aiohttp.ClientSession() as http, http.ws_connect(idle_server.url + "/v1/ws") as ws:
        await ws.send_str("{broken")
        assert (await ws.receive_json())["type"] == "error"
        await ws.send_json({"type": "generate", "id": "x", "messages": [], "max_tokens": 2})
        error = await ws.receive_json()
        assert error["type"] == "error" and error["id"] == "x" and error["error"]["param"] == "messages"
        await ws.send_json({"type": "generate", "id": "y", "prompt": "Hello", "max_tokens": 2, "temperature": 0})
        got = await collect(ws, {"y"})
    assert got["y"][-1]["type"] == "done"


async def test_disconnect_mid_stream_frees_the_slot(idle_server):
    cancelled = idle_server.counter("requests_total{outcome=cancelled}")  # earlier tests' count
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(idle_server.url + "/v1/ws")
        await ws.send_json({"type": "generate", "id": "gone", "prompt": "Once upon a time", "max_tokens": 2000})
        assert (await ws.receive_json())["type"] == "tokens"
        await ws.close()
    deadline = time.monotonic() + 10
    while idle_server.health()["scheduler"]["active"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert idle_server.health()["scheduler"]["active"] == 0
    # Freed by cancelling it, not by the story happening to end within the wait.
    assert idle_server.counter("requests_total{outcome=cancelled}") - cancelled == 1


async def test_generate_takes_the_http_apis_processing_fields(idle_server):
    """Penalties, logit_bias, response_format, logprobs and pacing over the socket give what the HTTP
    API gives for the same request."""
    import json

    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "maxLength": 20}}}
    fields = {"temperature": 0, "max_tokens": 24, "presence_penalty": 0.4, "logit_bias": {"28": -5},
              "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(idle_server.url + "/v1/ws") as ws:
            await ws.send_json({"type": "generate", "id": "a", "messages": CAPITAL, "logprobs": 2,
                                "stream_pacing": True, **fields})
            got = (await collect(ws, {"a"}))["a"]
        async with http.post(idle_server.url + "/v1/chat/completions",
                             json={"messages": CAPITAL, "logprobs": True, "top_logprobs": 2, **fields}) as r:
            assert r.status == 200, await r.text()
            want = (await r.json())["choices"][0]
    tokens = [m for m in got if m["type"] == "tokens"]
    text = "".join(m["text"] for m in tokens)
    assert text == want["message"]["content"] and json.loads(text)["city"]
    entries = [e for m in tokens for e in m["logprobs"]]
    assert [e["token"] for e in entries] == [e["token"] for e in want["logprobs"]["content"]]
    # the grammar's mask leaves forced positions one alternative
    assert max(len(e["top_logprobs"]) for e in entries) == 2
    for got_entry, want_entry in zip(entries, want["logprobs"]["content"]):
        assert [t["token"] for t in got_entry["top_logprobs"]] == [t["token"] for t in want_entry["top_logprobs"]]
        assert got_entry["logprob"] == pytest.approx(want_entry["logprob"], abs=2e-3)
    assert all(len(m["token_ids"]) == 1 for m in tokens)  # paced: one token per frame
