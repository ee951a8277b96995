"""The dashboard's routes: /v1/dashboard (JSON), /v1/dashboard/stream (the same as SSE, once a
second), /dashboard (the live page, runtime/static/) and /v1/traces (the decision ring as JSONL).

The JSON joins the scheduler's own account (the Describe ask: its mode's block, the gate, the
controller's cost model and acceptance estimates) and telemetry's (series, requests, registry views).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
from aiohttp import web

from runtime.decisions import encode_line, header_from_config
from runtime.messages import ActorFailure
from runtime.observe import DescribeTraffic, ExportTraces

STATIC = Path(__file__).resolve().parent / "static"
PUSH_EVERY_S = 1.0


async def dashboard_data(system) -> dict:
    scheduler = await system.describe_scheduler() or {}
    traffic = await system.telemetry.ask(DescribeTraffic())
    spec = scheduler.get("speculation") or {}
    last = traffic.get("last_decision") or {}
    info = system.info
    return {"model": info.model_id, "mode": system.config.scheduler.mode, "blas": info.blas,
            "uptime_s": round(time.monotonic() - system.started_at, 3), "at": time.time(),
            "status": "degraded" if system.failure else "ok",
            "decider": spec.get("decider"), "drafter": spec.get("drafter"),
            "scheduler": scheduler, "gate": spec.get("gate"), "controller": spec.get("controller"),
            "cost_cells_in_use": _cells_in_use(last), "acceptance_in_use": _acceptance_in_use(last), **traffic}


def _cells_in_use(last: dict) -> dict | None:
    """The cost-table row the latest controller decision read (at its batch width)."""
    ctl = (last.get("decision") or {}).get("controller")
    if not ctl:
        return None
    return {"width": last["width"], "depths": ctl["depths"],
            "verify_ms": [c[0] for c in ctl["verify"]], "verify_j": [c[1] for c in ctl["verify"]],
            "draft_ms": [c[0] for c in ctl["draft"]], "draft_j": [c[1] for c in ctl["draft"]]}


def _acceptance_in_use(last: dict) -> list | None:
    ctl = (last.get("decision") or {}).get("controller")
    return [s for s in ctl["seqs"] if s] if ctl else None


async def dashboard(request: web.Request) -> web.Response:
    body = await dashboard_data(request.app["system"])
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def dashboard_stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the dashboard JSON once a second until the client or the server leaves."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    system = request.app["system"]
    try:
        while not system.telemetry.closing:
            body = msgspec.json.encode(await dashboard_data(system))
            await response.write(b"data: " + body + b"\n\n")
            await asyncio.sleep(PUSH_EVERY_S)
    except (ActorFailure, ConnectionResetError):
        pass  # the server is stopping, or the page went away
    return response


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "dashboard.html")


async def traces(request: web.Request) -> web.Response:
    system = request.app["system"]
    records = await system.telemetry.ask(ExportTraces())
    header = header_from_config(system.config, system.info.model_id, system.info.drafter)
    body = b"".join([encode_line(header), *records])
    return web.Response(body=body, content_type="application/x-ndjson")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/dashboard", dashboard)
    app.router.add_get("/v1/dashboard/stream", dashboard_stream)
    app.router.add_get("/v1/traces", traces)
    app.router.add_get("/dashboard", page)
    app.router.add_static("/static", STATIC)
