"""HTTP disconnects cancel their request; SIGTERM ends in-flight requests with a terminal event."""

import asyncio
import json
import time

import aiohttp

from tests.integration.conftest import ServerProcess

LONG = {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 2000,
        "temperature": 0, "stream": True}


async def test_http_disconnect_mid_stream_cancels_the_request(idle_server):
    async with aiohttp.ClientSession() as http:
        r = await http.post(idle_server.url + "/v1/chat/completions", json=LONG)
        first = await r.content.readline()
        rid = json.loads(first[len(b"data: "):])["id"]  # the server's request id
        r.close()
    deadline = time.monotonic() + 10
    while not ended(idle_server, rid) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    [end] = ended(idle_server, rid)  # this request, ended once, by the disconnect
    assert end["event"] == "cancelled" and end["reason"] == "client_gone"
    assert end["completion_tokens"] < LONG["max_tokens"]
    health = idle_server.health()
    assert health["scheduler"] == {**health["scheduler"], "active": 0, "waiting": 0}


def ended(server, rid: str) -> list[dict]:
    return [e for e in server.events(rid) if e["event"] in ("finished", "cancelled", "failed")]


async def test_sigterm_ends_in_flight_requests_then_exits_zero(model_dir, tmp_path):
    server = ServerProcess(tmp_path, extra=("--shutdown-timeout", "0"))  # cancel at once (test_drain.py drains)
    try:
        async with aiohttp.ClientSession() as http:
            r = await http.post(server.url + "/v1/chat/completions", json=LONG)
            assert (await r.content.readline()).startswith(b"data: ")
            server.proc.terminate()
            lines = [line async for line in r.content if line.strip()]
    finally:
        code = server.stop()
    assert lines[-1] == b"data: [DONE]\n"
    terminal = json.loads(lines[-2][len(b"data: "):])
    assert "error" in terminal and "shutdown" in terminal["error"]["message"]
    assert code == 0
