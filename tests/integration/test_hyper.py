"""Hyper mode served by a real `metrale serve` (default model, tree executor on): many concurrent
clients each get a full answer, served one at a time in arrival order; a waiting request whose client
leaves is released before it starts and counted; the scheduler.hyper block on /health."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.integration.conftest import ServerProcess

QUESTIONS = ["What is the capital of France?", "Name three colours.", "Write a haiku about rain.",
             "What is 2 + 2?", "Give me one tip for sleeping well.", "Say hello in French."]


@pytest.fixture(scope="module")
def hyper_server(model_dir, tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("hyper"), max_pending=16, extra=("--scheduler-mode", "hyper"))
    yield proc
    proc.stop()


def hyper_block(server) -> dict:
    return server.health()["scheduler"]["hyper"]


async def chat(http, url, question, max_tokens=16, stream=False):
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def trace_lines(server) -> list[dict]:
    return [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]


async def test_concurrent_clients_each_get_a_full_answer_one_at_a_time(hyper_server):
    before = hyper_block(hyper_server)
    async with aiohttp.ClientSession() as http:
        answers = await asyncio.gather(*(chat(http, hyper_server.url, q) for q in QUESTIONS))
    ids = [a["id"] for a in answers]
    for a in answers:
        assert a["choices"][0]["message"]["content"]
        assert a["usage"]["completion_tokens"] == 16 or a["choices"][0]["finish_reason"] == "stop"
    paris = answers[0]["choices"][0]["message"]["content"]
    assert paris.startswith("The capital of France is Paris.")
    lines = trace_lines(hyper_server)
    spans = {}
    for i, e in enumerate(lines):
        if e.get("request_id") in ids and e["event"] in ("prefilled", "finished"):
            spans.setdefault(e["request_id"], []).append(i)
    intervals = sorted((span[0], span[-1]) for span in spans.values())
    assert len(intervals) == len(QUESTIONS)
    assert all(a_end < b_start for (_, a_end), (b_start, _) in zip(intervals, intervals[1:]))  # never overlapping
    admitted = [e["request_id"] for e in lines if e.get("event") == "admitted" and e.get("request_id") in ids]
    started = [e["request_id"] for e in lines if e.get("event") == "prefilled" and e.get("request_id") in ids]
    assert started == admitted  # served in arrival order
    after = hyper_block(hyper_server)
    assert after["completed_total"] - before["completed_total"] == len(QUESTIONS)
    assert after["stage"] == "h0" and after["admission_cap"] == 1 and after["passthrough"] == "serial_b1"
    assert after["active"] == 0 and after["queue_depth"] == 0 and after["width_executor_installed"]
    assert after["run_s"]["count"] >= len(QUESTIONS)


async def test_a_waiting_request_whose_client_leaves_is_released_and_counted(hyper_server):
    before = hyper_block(hyper_server)
    async with aiohttp.ClientSession() as http:
        long = asyncio.create_task(chat(http, hyper_server.url, "Tell me a long story.", max_tokens=200))
        while hyper_block(hyper_server)["active"] == 0:
            await asyncio.sleep(0.05)
        body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 20, "stream": True}
        r = await http.post(hyper_server.url + "/v1/chat/completions", json=body)
        while hyper_block(hyper_server)["queue_depth"] == 0:
            await asyncio.sleep(0.02)
        r.close()  # leaves while it waits
        for _ in range(200):
            if hyper_block(hyper_server)["abandoned_before_start_total"] > before["abandoned_before_start_total"]:
                break
            await asyncio.sleep(0.05)
        mid = hyper_block(hyper_server)
        assert mid["abandoned_before_start_total"] == before["abandoned_before_start_total"] + 1
        assert mid["queue_depth"] == 0 and mid["active"] == 1
        assert (await long)["usage"]["completion_tokens"] > 0
    after = hyper_block(hyper_server)
    assert after["completed_total"] == before["completed_total"] + 1 and after["failed_total"] == before["failed_total"]


def test_serial_and_batch_blocks_stay_as_they_were(server):
    scheduler = server.health()["scheduler"]
    assert scheduler["mode"] == "serial" and scheduler["hyper"] == {} and "steps_by_kind" in scheduler["serial"]
