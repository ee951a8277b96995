"""SIGTERM on a real `metrale serve` subprocess (a tiny model): admission stops (a new request gets
a 503 in OpenAI's error shape, /health says draining), a request that can finish within
--shutdown-timeout finishes, the ones that cannot are cancelled (shutdown) with one terminal event
each, over SSE and WebSocket, and the process exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from tests.integration.conftest import ServerProcess

DRAIN_S, LONG = 3, 4000  # LONG tokens take the tiny model far more than DRAIN_S


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    from tests.tiny import save_tiny_dir

    folder = save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=3)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    return folder


async def sse(http, url: str, max_tokens: int, started: asyncio.Event) -> list[dict]:
    body = {"prompt": "t3 t4", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    events = []
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: "):
                started.set()
                events.append("[DONE]" if line.strip() == b"data: [DONE]" else json.loads(line[6:]))
    return events


async def ws(http, url: str, started: asyncio.Event) -> list[dict]:
    async with http.ws_connect(url + "/v1/ws") as sock:
        await sock.send_json({"type": "generate", "id": "w", "prompt": "t3 t4", "max_tokens": LONG})
        frames = [await sock.receive_json()]
        started.set()
        while frames[-1]["type"] == "tokens":
            frames.append(await sock.receive_json())
    return frames


def terminals(log: str) -> dict[str, list[str]]:
    """Each admitted request's terminal events, from the server's JSON trace lines."""
    ends: dict[str, list[str]] = {}
    for event in (json.loads(line) for line in log.splitlines() if line.startswith("{")):
        if event.get("event") == "admitted":
            ends.setdefault(event["request_id"], [])
        elif event.get("event") in ("finished", "cancelled", "failed") and event.get("actor") == "scheduler":
            ends.setdefault(event["request_id"], []).append(f"{event['event']}:{event.get('reason')}")
    return ends


async def test_sigterm_drains_then_cancels_and_exits_0(long_model, tmp_path):
    server = ServerProcess(tmp_path, max_pending=16, extra=(
        "--model", str(long_model), "--drafter", "none", "--spec-cost-model", "off",
        "--scheduler-mode", "mtp_batch", "--max-active-requests", "4", "--shutdown-timeout", str(DRAIN_S)))
    try:
        async with aiohttp.ClientSession() as http:
            flags = [asyncio.Event() for _ in range(3)]
            short = asyncio.create_task(sse(http, server.url, 300, flags[0]))
            long = asyncio.create_task(sse(http, server.url, LONG, flags[1]))
            socket_ = asyncio.create_task(ws(http, server.url, flags[2]))
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), 30)
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.3)
            async with http.post(server.url + "/v1/completions", json={"prompt": "t3", "max_tokens": 2}) as r:
                assert r.status == 503
                error = (await r.json())["error"]
                assert "shutting down" in error["message"] and error["type"] == "server_error"
            async with http.get(server.url + "/health") as r:
                assert r.status == 503 and (await r.json())["status"] == "draining"
            short_events, long_events, frames = await asyncio.wait_for(asyncio.gather(short, long, socket_), 60)
        assert server.proc.wait(30) == 0
        assert time.monotonic() - signalled < DRAIN_S + 20
    finally:
        server.stop()
    assert short_events[-1] == "[DONE]" and short_events[-2]["choices"][0]["finish_reason"] == "length"
    assert long_events[-1] == "[DONE]" and "shutdown" in long_events[-2]["error"]["message"]
    assert frames[-1]["type"] == "error" and "shutdown" in frames[-1]["error"]["message"]
    draining = [json.loads(line) for line in server.log().splitlines() if '"draining"' in line]
    assert draining[0]["open_requests"] == 3  # all three were in flight at the signal
    ends = terminals(server.log())
    assert sorted(map(tuple, ends.values())) == [("cancelled:shutdown",), ("cancelled:shutdown",),
                                                 ("finished:length",)], ends
