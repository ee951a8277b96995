"""metrale bench load: many concurrent clients on loopback; nothing may be lost, hang or 5xx.

Starts `metrale serve` as a subprocess per mode (serial, mtp_batch with 16 active; speculation as
the defaults have it) and drives it with --clients concurrent clients sharing --requests short
requests (max_tokens 1..8), each drawn from a seeded mix: non-streaming JSON (35%), SSE read to
[DONE] (25%), SSE dropped after its first chunk (10%, the client disconnects), WebSocket read to
its end (25%), WebSocket cancelled after its first tokens (5%). One owner fault is injected mid-run
(the test-only --fault-after-steps of `metrale serve`, at FAULT_AT[mode] x --requests model steps;
--no-fault leaves it out): the requests of that step fail with a 500 naming it.

Counted per mode: admitted (any answer but a 429), finished, cancelled, failed, rejected_429,
lost (admitted without exactly one terminal event: the client saw none or two, or the server's
trace log has not exactly one finished/cancelled/failed for the request id it admitted, or the
streamer logged a duplicate), hung (no terminal event within --deadline s), injected_5xx (5xx
that name the injected fault), faults (injected faults the server's log shows), unexpected_5xx
(any other 5xx status or error event), p50/p99 TTFT and inter-token latency (ms,
streamed requests). Last line, over all modes: lost=N hung=N unexpected_5xx=N rejected_429=N
requests=N p99_ttft_ms=X.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp

from runtime.bench.common import table

MIX = (("json", 35), ("sse", 25), ("sse_drop", 10), ("ws", 25), ("ws_cancel", 5))
PROMPTS = ("Hi", "Name a colour.", "What is 2+2?", "Say yes.", "def add(a, b):", "Count to three.")
MODES = {"serial": [], "mtp_batch": ["--scheduler-mode", "mtp_batch", "--max-active-requests", "16"]}
# The injected fault's model step per request of the run: about half-way (serial: ~3.5 steps a
# request; mtp_batch: ~16 requests share a step).
FAULT_AT = {"serial": 1.5, "mtp_batch": 0.1}
INJECTED = "injected fault"  # in the error of every request of the failed step (runtime/faults.py)


@dataclass
class Outcome:
    kind: str
    status: str = "hung"  # finished | cancelled | failed | rejected | dropped | hung
    terminals: int = 0  # terminal events the client saw
    http: int = 0
    server_error: bool = False
    injected: bool = False  # the error named the injected fault
    request_id: str | None = None
    error: str | None = None  # a connection error the client saw
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from kernels.default_model import ensure_default_model
    from runtime.bench._served import ServedProcess

    model_dir = ensure_default_model()
    rows, totals = [], []
    for mode in args.modes.split(","):
        fault = ["--fault-after-steps", str(max(1, int(FAULT_AT[mode] * args.requests)))] if args.fault else []
        with ServedProcess(model_dir, MODES[mode] + fault + args.serve_args.split()) as server:
            outcomes = asyncio.run(drive(server.url, args.clients, args.requests, args.seed, args.deadline))
            time.sleep(1.0)  # the last cancellations reach the trace log
            counts = count(outcomes, server.log_path.read_text(errors="replace"))
        rows.append([mode, *(counts[k] for k in COLUMNS)])
        totals.append(counts)
    print(table(["mode", *COLUMNS], rows))
    print(last_line(totals))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metrale bench load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=10_000, help="requests in all, per mode")
    p.add_argument("--modes", default="serial,mtp_batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, default=400.0,
                   help="seconds a request may take before it counts as hung (beyond the queue wait)")
    p.add_argument("--fault", action=argparse.BooleanOptionalAction, default=True,
                   help="inject one model-owner fault mid-run (test-only serve flag --fault-after-steps)")
    p.add_argument("--serve-args", default="", help="extra `metrale serve` flags, e.g. '--max-pending 64'")
    return p


async def drive(url: str, clients: int, requests: int, seed: int = 0, deadline: float = 400.0) -> list[Outcome]:
    """clients concurrent loops sharing `requests` requests; each request's outcome."""
    rng = random.Random(seed)
    kinds = rng.choices([k for k, _ in MIX], weights=[w for _, w in MIX], k=requests)
    plan = [(kind, rng.choice(PROMPTS), rng.randint(1, 8)) for kind in kinds]
    todo = iter(range(requests))
    outcomes = [Outcome(kind) for kind, _, _ in plan]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(_client(http, url, plan, todo, outcomes, deadline) for _ in range(clients)))
    return outcomes


async def _client(http, url: str, plan, todo, outcomes: list[Outcome], deadline: float) -> None:
    for i in todo:
        kind, prompt, max_tokens = plan[i]
        try:
            await asyncio.wait_for(_one(http, url, i, prompt, max_tokens, outcomes), deadline)
        except TimeoutError:
            outcomes[i].status = "hung"
        except (aiohttp.ClientError, ConnectionError) as e:  # seen by the client as no terminal event
            outcomes[i].status, outcomes[i].error = "failed", repr(e)


async def _one(http, url: str, i: int, prompt: str, max_tokens: int, outcomes: list[Outcome]) -> None:
    if not outcomes[i].kind.startswith("ws"):
        return await _http(http, url, prompt, max_tokens, outcomes[i])
    # A socket per request: an idle socket whose client is busy elsewhere misses the server's
    # heartbeat pings and is closed by it (correctly).
    async with http.ws_connect(url + "/v1/ws") as ws:
        await _ws(ws, i, prompt, max_tokens, outcomes)


async def _http(http, url: str, prompt: str, max_tokens: int, out: Outcome) -> None:
    stream = out.kind != "json"
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}
    started = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        out.http = r.status
        out.server_error = r.status >= 500
        if r.status == 429:
            out.status = "rejected"
            return
        if not stream:
            payload = await r.json()
            out.request_id = payload.get("id")
            out.injected = INJECTED in payload.get("error", {}).get("message", "")
            out.terminals = 1
            out.status = "finished" if r.status == 200 else "failed"
            out.ttft = time.perf_counter() - started
            return
        await _read_sse(r, out, started)


async def _read_sse(r, out: Outcome, started: float) -> None:
    last = None
    async for line in r.content:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        now = time.perf_counter()
        event = json.loads(line[6:])
        if "error" in event:
            out.terminals += 1
            out.status = "cancelled" if "cancelled" in event["error"]["message"] else "failed"
            out.server_error |= event["error"]["code"] >= 500 and out.status == "failed"
            out.injected |= INJECTED in event["error"]["message"]
            continue
        out.request_id = event["id"]
        if event["choices"] and event["choices"][0]["finish_reason"] is not None:
            out.terminals += 1
            out.status = "finished"
            continue
        out.ttft = out.ttft or now - started
        if last is not None:
            out.gaps.append(now - last)
        last = now
        if out.kind == "sse_drop":
            out.status = "dropped"  # the server cancels it (client_gone): its trace log shows it
            return


async def _ws(ws, i: int, prompt: str, max_tokens: int, outcomes: list[Outcome]) -> None:
    out, cid = outcomes[i], f"r{i}"  # its own socket: every frame is this request's
    await ws.send_json({"type": "generate", "id": cid, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    started, last = time.perf_counter(), None
    while True:
        msg = await ws.receive_json()
        now = time.perf_counter()
        if msg["type"] == "tokens":
            if out.ttft is None and out.kind == "ws_cancel":
                await ws.send_json({"type": "cancel", "id": cid})
            out.ttft = out.ttft or now - started
            if last is not None:
                out.gaps.append(now - last)
            last = now
            continue
        out.terminals += 1
        if msg["type"] == "done":
            out.status = "cancelled" if msg["finish_reason"] == "cancelled" else "finished"
        else:
            out.status = "rejected" if msg["error"]["code"] == 429 else "failed"
            out.server_error = msg["error"]["code"] >= 500
            out.injected = INJECTED in msg["error"]["message"]
        return


COLUMNS = ("requests", "admitted", "finished", "cancelled", "failed", "rejected_429", "lost", "hung",
           "faults", "injected_5xx", "unexpected_5xx", "p50_ttft_ms", "p99_ttft_ms", "p50_itl_ms", "p99_itl_ms")


def count(outcomes: list[Outcome], log: str) -> dict:
    admitted_ids, ends, duplicates = _server_side(log)
    admitted = [o for o in outcomes if o.status != "rejected" and o.http != 429]
    client_lost = sum(1 for o in admitted if o.status not in ("dropped", "hung") and o.terminals != 1)
    server_lost = sum(1 for rid in admitted_ids if ends.get(rid, 0) != 1) + duplicates
    ttfts = sorted(o.ttft * 1e3 for o in outcomes if o.ttft is not None and o.kind != "json")
    gaps = sorted(g * 1e3 for o in outcomes for g in o.gaps)
    return {"requests": len(outcomes), "admitted": len(admitted),
            "finished": sum(o.status == "finished" for o in outcomes),
            "cancelled": sum(o.status in ("cancelled", "dropped") for o in outcomes),
            "failed": sum(o.status == "failed" for o in outcomes),
            "rejected_429": sum(o.status == "rejected" for o in outcomes),
            "lost": client_lost + server_lost, "hung": sum(o.status == "hung" for o in outcomes),
            "faults": log.count('"fault_injected"'),
            "injected_5xx": sum(o.server_error and o.injected for o in outcomes),
            "unexpected_5xx": sum(o.server_error and not o.injected for o in outcomes),
            "p50_ttft_ms": _pct(ttfts, 50), "p99_ttft_ms": _pct(ttfts, 99),
            "p50_itl_ms": _pct(gaps, 50), "p99_itl_ms": _pct(gaps, 99)}


def _server_side(log: str) -> tuple[set[str], dict[str, int], int]:
    """From the JSON trace lines: ids admitted, terminal events per id, duplicate terminals seen."""
    admitted, ends, duplicates = set(), {}, 0
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        rid, name = event.get("request_id"), event.get("event")
        if name == "admitted":
            admitted.add(rid)
        elif name in ("finished", "cancelled", "failed") and event.get("actor") == "scheduler":
            ends[rid] = ends.get(rid, 0) + 1
        elif name == "duplicate_terminal":
            duplicates += 1
    return admitted, ends, duplicates


def _pct(values: list[float], q: int) -> float:
    return round(values[min(len(values) - 1, len(values) * q // 100)], 1) if values else 0.0


def last_line(totals: list[dict]) -> str:
    keys = ("lost", "hung", "unexpected_5xx", "rejected_429", "requests")
    parts = [f"{k}={sum(t[k] for t in totals)}" for k in keys]
    return " ".join(parts + [f"p99_ttft_ms={max((t['p99_ttft_ms'] for t in totals), default=0.0)}"])
