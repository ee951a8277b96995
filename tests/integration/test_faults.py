"""Faults on the real HTTP server on loopback, in process, with a tiny model and a model owner that
can be told to fail (a test-only subclass: the server has no fault switch).

- The engine raises mid-step: every request of that step fails with a clear error (JSON 500, SSE
  error event, WebSocket error frame) and the server goes on serving; /health stays ok.
- The engine returns garbage, which kills the scheduler: the system is degraded, every in-flight
  request fails with a 503 naming the failure, /health answers 503 degraded, new requests get a
  503 at once, and nothing hangs.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.integration.inprocess import PROMPT, Served, tiny_model

TIMEOUT = 30  # nothing may take longer: a hang fails the test instead of stalling it


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def body(stream: bool = False, max_tokens: int = 400) -> dict:
    return {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": stream}


async def whole(served: Served) -> tuple[int, dict]:
    async with served.http.post(served.url + "/v1/completions", json=body()) as r:
        return r.status, await r.json()


async def streamed(served: Served) -> list[dict]:
    """The SSE events of one request, up to [DONE]."""
    async with served.http.post(served.url + "/v1/completions", json=body(stream=True)) as r:
        assert r.status == 200
        lines = [line async for line in r.content if line.startswith(b"data: ")]
    assert lines[-1].strip() == b"data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


async def over_ws(served: Served) -> list[dict]:
    async with served.http.ws_connect(served.url + "/v1/ws") as ws:
        await ws.send_json({"type": "generate", "id": "a", "prompt": PROMPT, "max_tokens": 400, "temperature": 0})
        frames = []
        while not frames or frames[-1]["type"] == "tokens":
            frames.append(await ws.receive_json())
    return frames


async def all_three(served: Served):
    async with asyncio.timeout(TIMEOUT):
        return await asyncio.gather(whole(served), streamed(served), over_ws(served))


async def test_an_engine_fault_fails_its_step_with_a_clear_error_and_the_server_goes_on(model_dir):
    async with Served(model_dir) as served:
        served.owner.fault = "raise"
        (status, reply), events, frames = await all_three(served)
        assert status == 500 and "injected engine fault" in reply["error"]["message"]
        assert "injected engine fault" in events[-1]["error"]["message"]
        assert frames[-1]["type"] == "error" and "injected engine fault" in frames[-1]["error"]["message"]
        served.owner.fault = None
        (status, reply), events, frames = await all_three(served)
        assert status == 200 and reply["choices"][0]["finish_reason"] == "length"
        assert events[-1]["choices"][0]["finish_reason"] == "length" and frames[-1]["type"] == "done"
        async with served.http.get(served.url + "/health") as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"


async def test_a_dead_scheduler_fails_every_request_and_health_says_degraded(model_dir):
    async with Served(model_dir) as served:
        served.owner.fault = "junk"
        (status, reply), events, frames = await all_three(served)
        for error in (reply["error"], events[-1]["error"], frames[-1]["error"]):
            assert error["code"] == 503 and "scheduler stopped" in error["message"], error
        assert status == 503
        async with served.http.get(served.url + "/health") as r:
            health = await r.json()
            assert r.status == 503 and health["status"] == "degraded" and "scheduler" in health["failure"]
        async with asyncio.timeout(TIMEOUT):  # after the failure: refused at once, over HTTP and WebSocket
            status, reply = await whole(served)
            frames = await over_ws(served)
        assert status == 503 and "degraded" in reply["error"]["message"]
        assert len(frames) == 1 and frames[0]["type"] == "error" and frames[0]["error"]["code"] == 503
