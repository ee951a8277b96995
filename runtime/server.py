"""The HTTP server: routes, health and metrics (the dashboard's in runtime/dashboard.py), start-up and
graceful shutdown: SIGTERM (or SIGINT) stops admitting (a new request gets a 503), lets in-flight
requests finish for up to --shutdown-timeout seconds, then cancels the rest, each with its one
terminal event; `metrale serve` then exits 0."""

from __future__ import annotations

import asyncio
import signal
import time

import msgspec
from aiohttp import web

from runtime.anthropic_api import messages
from runtime.auth import auth_middleware, warn_if_open
from runtime.config import Config
from runtime.dashboard import add_routes
from runtime.decisions import header_from_config
from runtime.messages import Snapshot
from runtime.metrics import CONTENT_TYPE
from runtime.observe import WriteTraces
from runtime.openai_api import chat_completions, completions, error_response
from runtime.openapi import openapi_json
from runtime.system import System
from runtime.ws import websocket


def build_app(system: System, config: Config) -> web.Application:
    middlewares = [_json_errors] if config.server.api_key is None else \
        [auth_middleware(config.server.api_key), _json_errors]  # auth first: a 401 says nothing of routes
    app = web.Application(client_max_size=config.server.max_body_bytes, middlewares=middlewares)
    app["system"], app["config"] = system, config
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/messages", messages)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/ws", websocket)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    add_routes(app)
    app.router.add_get("/openapi.json", openapi_json)
    return app


@web.middleware
async def _json_errors(request: web.Request, handler):
    """aiohttp's own errors (404, 405, 413) as OpenAI-style JSON."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        response = error_response(e.reason, e.status)
        if "Allow" in e.headers:  # a 405 says which methods the route takes
            response.headers["Allow"] = e.headers["Allow"]
        return response


async def models(request: web.Request) -> web.Response:
    info = request.app["system"].info
    body = {"object": "list", "data": [{"id": info.model_id, "object": "model", "owned_by": "metrale",
                                        "created": 0, "context_length": info.context_length}]}
    return web.json_response(body)


async def health(request: web.Request) -> web.Response:
    system: System = request.app["system"]
    info = system.info
    # Each answers between its own jobs: ask both at once, so one's wait does not add to the other's
    scheduler, prompt_cache = await asyncio.gather(system.describe_scheduler(), system.describe_prompt_cache())
    body = {
        "status": "degraded" if system.failure else "draining" if system.drain.closed else "ok",
        "failure": system.failure,
        "model": info.model_id, "model_path": info.path, "dtype": info.dtype, "quantization": info.quantization,
        "context_length": info.context_length, "blas": info.blas, "matmul": info.matmul,
        "mode": system.config.scheduler.mode,
        "uptime_s": round(time.monotonic() - system.started_at, 3),
        "scheduler": scheduler,
        "prompt_cache": prompt_cache,
        "distributed": system.describe_group(),
        "owner_ms": system.describe_owner(),
        "telemetry": await system.telemetry.ask(Snapshot()),
    }
    return web.Response(body=msgspec.json.encode(body), content_type="application/json",
                        status=503 if system.failure or system.drain.closed else 200)  # a monitor reads it alone


async def metrics(request: web.Request) -> web.Response:
    body = await request.app["system"].telemetry.ask(Snapshot(format="prometheus"))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def make_runner(system: System, config: Config) -> web.AppRunner:
    """The app's runner; keepalive_timeout closes a connection whose next request header is not
    complete in time (aiohttp's one clock for an idle connection and a header that trickles in)."""
    return web.AppRunner(build_app(system, config), handler_cancellation=True, access_log=None,
                         keepalive_timeout=config.server.keepalive_timeout)


async def serve(system: System, config: Config, ready: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM, then drain: see the module docstring."""
    await system.start()
    if config.server.trace_file:  # before any request: the file starts with the server
        header = header_from_config(system.config, system.info.model_id, system.info.drafter)
        await system.telemetry.ask(WriteTraces(path=config.server.trace_file, header=header))
    runner = make_runner(system, config)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port)
    await site.start()
    system.log.info("listening", host=config.server.host, port=config.server.port,
                    auth="bearer" if config.server.api_key else "none")
    warn_if_open(config.server.host, config.server.api_key, system.log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    timeout = config.server.shutdown_timeout
    system.log.info("draining", open_requests=system.drain.open, timeout_s=timeout)
    drained = await system.drain.close(timeout)
    system.log.info("shutting_down", drained=drained, cancelled=system.drain.open)
    await system.stop()  # cancels what is still in flight: each client gets its terminal event
    await runner.cleanup()
