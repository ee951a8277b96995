"""Distributed serving under a real `mlx.launch --backend ring -n 2` on loopback.

The default model over 2 processes (split by layers: its 9 attention heads do not divide by 2; the
serial group's ranks are named in a --hostfile, the others' by -n 2), the MTP head forced to
speculate: greedy output of several requests, in serial and in mtp_batch, is byte-identical to the
single-process server's plain decode. SIGTERM on rank 0 stops the follower.
A follower that stops answering (SIGSTOP) fails the requests in flight with a clear error, each
stream ending with exactly one terminal event, and /health reports the lost group; a killed
follower does the same and the whole group then exits, nothing hangs; a killed mlx.launch leaves no
rank behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from runtime.bench._group import LaunchedGroup, ring_available, wait_until

pytestmark = pytest.mark.skipif(ring_available() is not None, reason=f"no mlx.launch here: {ring_available()}")

PROMPTS = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWrite a Python function that returns the squares of a list.<|im_end|>\n"
           "<|im_start|>assistant\n",
           "one two three one two three one two"]
# ~300 tokens: over several prefill chunks of the batch group (a stage's sends and receives per chunk)
LONG = "<|im_start|>user\n" + " ".join(f"Item {i} is a {('red', 'green', 'blue')[i % 3]} box." for i in range(40)) \
    + " Which items are blue?<|im_end|>\n<|im_start|>assistant\n"
FORCED = ["--mtp-gate", "force", "--spec-cost-model", "off", "--num-draft-tokens", "3"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def serial_group(model_dir):
    with LaunchedGroup(model_dir, FORCED, hostfile=True) as group:  # the --hostfile form of mlx.launch
        yield group


@pytest.fixture(scope="module")
def batch_group(model_dir):
    extra = [*FORCED, "--scheduler-mode", "mtp_batch", "--max-active-requests", "4", "--batch-wait-ms", "20",
             "--group-timeout-s", "8", "--prefill-step", "96"]  # LONG prefills in several chunks
    with LaunchedGroup(model_dir, extra) as group:
        yield group


async def complete(http, url, prompt, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def same_as_alone(group_url: str, alone_url: str, prompts: list[str], together: bool) -> list[dict]:
    """The group's answers (sent together or one by one) checked against the single process's."""
    async with aiohttp.ClientSession() as http:
        if together:
            got = await asyncio.gather(*(complete(http, group_url, p) for p in prompts))
        else:
            got = [await complete(http, group_url, p) for p in prompts]
        want = [await complete(http, alone_url, p, disable_mtp=True) for p in prompts]
    for prompt, g, w in zip(prompts, got, want):
        assert g["choices"][0]["text"] == w["choices"][0]["text"], prompt
    assert any(r["usage"]["speculation"]["verify_steps"] for r in got)  # speculation ran, distributed
    return got


def test_serial_greedy_output_is_the_single_process_output(serial_group, idle_server):
    asyncio.run(same_as_alone(serial_group.url, idle_server.url, PROMPTS, together=False))
    group = serial_group.health()["distributed"]
    assert group["state"] == "ok" and group["size"] == 2 and group["parallel"] == "pipeline"
    assert group["commands"] > 0 and group["collectives_ms"]["1"] > 0 and group["collectives_ms"]["command"] > 0


def test_sigterm_on_rank_0_stops_the_follower(serial_group):
    pids = serial_group.pids
    os.kill(pids[0], signal.SIGTERM)
    assert serial_group.wait_exit(60) is not None  # mlx.launch ends once every rank has
    assert "follower_stopped" in serial_group.log_tail(20000)  # told to stop, not killed
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_mtp_batch_greedy_output_is_the_single_process_output(batch_group, idle_server):
    asyncio.run(same_as_alone(batch_group.url, idle_server.url, [*PROMPTS, LONG], together=True))
    width = batch_group.health()["scheduler"]["mtp_batch"]["batch_width_histogram"]
    assert max(int(w) for w in width) >= 2


async def streamed(http, url: str, started: asyncio.Event) -> list[dict]:
    body = {"prompt": PROMPTS[2], "max_tokens": 400, "temperature": 0, "stream": True}
    lines = []
    async with http.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: "):
                lines.append(line)
                started.set()
    assert lines[-1].strip() == b"data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


async def fault_while_streaming(group: LaunchedGroup, sig: int) -> list[list[dict]]:
    """Three streams decoding when the follower gets `sig`; their events."""
    async with aiohttp.ClientSession() as http, asyncio.timeout(60):
        started = [asyncio.Event() for _ in range(3)]
        streams = [asyncio.create_task(streamed(http, group.url, s)) for s in started]
        for s in started:
            await s.wait()
        group.signal_rank(1, sig)
        return await asyncio.gather(*streams)


def gone(pids: list[int]) -> bool:
    return not any(Path(f"/proc/{pid}").exists() for pid in pids)


async def late_request(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, asyncio.timeout(10):
        async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}) as r:
            return r.status, await r.text()


def one_error_each(streams: list[list[dict]]) -> None:
    for events in streams:
        errors = [e for e in events if "error" in e]
        assert len(errors) == 1 and events[-1] is errors[0], events[-3:]  # one terminal event, an error
        assert "distributed group lost" in errors[0]["error"]["message"]


def test_a_follower_that_stops_answering_fails_requests_and_health_reports_it(batch_group):
    pids = batch_group.pids
    try:
        one_error_each(asyncio.run(fault_while_streaming(batch_group, signal.SIGSTOP)))
        health = batch_group.health()
        assert health["status"] == "degraded" and "distributed group lost" in health["failure"]
        assert health["distributed"]["state"] == "lost"
        status, text = asyncio.run(late_request(batch_group.url))  # refused at once, with the reason
        assert status == 503 and "distributed group lost" in text
    finally:
        batch_group.signal_rank(1, signal.SIGKILL)
    # mlx.launch stops rank 0 once a rank died: the whole group ends, nothing hangs, nothing is left
    assert batch_group.wait_exit(60) is not None and wait_until(lambda: gone(pids), 30)


@pytest.fixture
def tiny_group(tmp_path):
    from tests.tiny import save_tiny_dir

    folder = save_tiny_dir(tmp_path / "tiny", seed=3)
    with LaunchedGroup(folder, ["--scheduler-mode", "mtp_batch", "--max-active-requests", "4",
                                "--group-timeout-s", "3", "--drafter", "none"]) as group:
        yield group



def test_a_killed_follower_fails_requests_in_flight_and_the_group_exits(tiny_group):
    assert tiny_group.health()["distributed"]["parallel"] == "tensor"  # 4 heads, 2 KV heads: split by 2
    pids = tiny_group.pids
    one_error_each(asyncio.run(fault_while_streaming(tiny_group, signal.SIGKILL)))
    assert tiny_group.wait_exit(60) is not None and wait_until(lambda: gone(pids), 10)


def test_a_killed_launcher_takes_its_ranks_with_it(tiny_group):
    pids = tiny_group.pids
    tiny_group.proc.kill()  # mlx.launch itself: it leaves its ranks running, they notice and end
    tiny_group.proc.wait(10)
    assert wait_until(lambda: gone(pids), 30)
