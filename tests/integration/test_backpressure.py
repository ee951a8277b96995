"""Backpressure at the limits: every actor's inbox bound at 1, many requests at once over the real
HTTP server and WebSocket on 127.0.0.1 (a tiny model). Nothing deadlocks, nothing is lost: every
request ends with exactly one terminal event, as its client and the streamer both see it, and
the sends the actors awaited while doing it form no cycle."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from runtime.actor import Actor
from runtime.config import ActorsConfig, Config
from tests.integration.inprocess import PROMPT, Served, tiny_model, every_event
from tests.unit.test_send_graph import assert_acyclic

REQUESTS, CLIENTS, TIMEOUT = 240, 48, 90


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def tiny_inboxes() -> Config:
    ones = {f.name: 1 for f in msgspec.structs.fields(ActorsConfig)}
    return msgspec.structs.replace(Config(), actors=ActorsConfig(**ones))


async def one(served: Served, i: int) -> tuple[str, int]:
    """Request i of a mix (JSON, SSE, WebSocket); its terminal outcome and the terminals seen."""
    body = {"prompt": PROMPT, "max_tokens": 1 + i % 6, "temperature": 0}
    if i % 3 == 2:
        async with served.http.ws_connect(served.url + "/v1/ws") as ws:
            await ws.send_json({"type": "generate", "id": "a", **body})
            frames = []
            while not frames or frames[-1]["type"] == "tokens":
                frames.append(await ws.receive_json())
            return frames[-1]["type"], sum(f["type"] != "tokens" for f in frames)
    stream = i % 3 == 1
    async with served.http.post(served.url + "/v1/completions", json={**body, "stream": stream}) as r:
        if not stream:
            return ("done" if r.status == 200 else f"http {r.status}"), 1
        events = [json.loads(line[6:]) async for line in r.content
                  if line.startswith(b"data: ") and line.strip() != b"data: [DONE]"]
        ends = [e for e in events if "error" in e or e["choices"][0]["finish_reason"] is not None]
        return ("done" if ends and "error" not in ends[-1] else "error"), len(ends)


def record_sends(monkeypatch) -> set[tuple[str, str]]:
    """(sending task, receiving actor) of every awaited send while the test runs."""
    edges: set[tuple[str, str]] = set()
    for verb in ("tell", "ask"):
        original = getattr(Actor, verb)

        async def send(self, msg, _original=original):
            edges.add((asyncio.current_task().get_name(), self.name))
            return await _original(self, msg)

        monkeypatch.setattr(Actor, verb, send)
    return edges


async def test_inboxes_of_one_and_many_requests_finish_with_nothing_lost(model_dir, monkeypatch):
    edges = record_sends(monkeypatch)
    todo = iter(range(REQUESTS))
    results: dict[int, tuple[str, int]] = {}

    async def client(served):
        for i in todo:
            results[i] = await one(served, i)

    with every_event() as logs:
        async with Served(model_dir, base=tiny_inboxes()) as served:
            async with asyncio.timeout(TIMEOUT):  # a deadlock fails here instead of hanging
                await asyncio.gather(*(client(served) for _ in range(CLIENTS)))
    assert len(results) == REQUESTS
    assert {outcome for outcome, _ in results.values()} == {"done"}, results
    assert all(terminals == 1 for _, terminals in results.values())
    assert not [e for e in logs if e["event"] in ("duplicate_terminal", "handler_failed", "actor_crashed")]
    finished = [e for e in logs if e["event"] == "finished" and e.get("actor") == "scheduler"]
    assert len({e["request_id"] for e in finished}) == len(finished) == REQUESTS
    actors = {"admission", "scheduler", "streamer", "telemetry", "model_owner", "drafter", "verifier"}
    graph: dict[str, set[str]] = {}
    for sender, receiver in edges:
        if sender in actors:
            graph.setdefault(sender, set()).add(receiver)
    assert "scheduler" in graph.get("admission", set()) and "streamer" in graph["scheduler"]
    assert_acyclic(graph)
