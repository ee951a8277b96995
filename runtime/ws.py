"""WebSocket token streaming at /v1/ws: several requests per socket, each under the client's id.

Client -> server: {"type": "generate", "id": ..., "messages" | "prompt": ..., sampling fields}
                  {"type": "cancel", "id": ...}
Server -> client: {"type": "tokens", "id", "text", "token_ids", "index"} per emitted batch,
                  then one of {"type": "done", "id", "finish_reason", "usage"} or
                  {"type": "error", "id", "error": {...}}. Closing the socket cancels its requests.
"""

from __future__ import annotations

import asyncio

import msgspec
from aiohttp import WSMsgType, web

from runtime.actor import Rejected
from runtime.gateway import new_request_id, open_request
from runtime.messages import ActorFailure, Cancel, Cancelled, Failed, Finished, Submit, TokensEmitted
from runtime.protocol import (
    ProtocolError, WsCancel, WsGenerate, decode_ws, error_body, sampling_params, ws_input,
)


async def websocket(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(heartbeat=30, max_msg_size=request.app["config"].server.max_body_bytes)
    await ws.prepare(request)
    tasks: dict[str, tuple[asyncio.Task, str]] = {}  # client id -> (its task, request id)
    try:
        async for frame in ws:
            if frame.type != WSMsgType.TEXT:
                continue
            await _on_message(request, ws, frame.data, tasks)
    finally:
        running = [task for task, _ in tasks.values()]
        for task in running:
            task.cancel()  # open_request cancels the request when its task is cancelled
        await asyncio.gather(*running, return_exceptions=True)
    return ws


async def _on_message(request, ws, data: str, tasks: dict) -> None:
    system = request.app["system"]
    try:
        msg = decode_ws(data)
        if isinstance(msg, WsCancel):
            if msg.id in tasks:  # the Cancelled event then reaches the client as its "done"
                system.scheduler.tell_nowait(Cancel(request_id=tasks[msg.id][1], reason="client"))
            return
        if msg.id in tasks:
            raise ProtocolError(f"id {msg.id!r} is already in use on this socket", "id")
        submit = _submit(msg, request.app["config"].admission.max_tokens_limit)
    except ProtocolError as e:
        await _send_error(ws, _client_id(data), e.message, e.status, e.param)
        return
    task = asyncio.create_task(_run(system, ws, msg.id, submit))
    tasks[msg.id] = (task, submit.request_id)
    task.add_done_callback(lambda _t, cid=msg.id: tasks.pop(cid, None))


def _submit(msg: WsGenerate, max_tokens_limit: int) -> Submit:
    params = sampling_params(msg, max_tokens_limit=max_tokens_limit)
    messages, prompt = ws_input(msg)
    return Submit(request_id=new_request_id("ws"), params=params, messages=messages, prompt=prompt)


async def _run(system, ws: web.WebSocketResponse, cid: str, submit: Submit) -> None:
    try:
        async with open_request(system, submit) as events:
            async for event in events:
                await ws.send_str(_frame(cid, event))
    except Rejected as e:
        await _send_error(ws, cid, e.message, e.status, e.param)
    except ActorFailure as e:
        await _send_error(ws, cid, e.message, e.status)
    except ConnectionResetError:
        pass


def _frame(cid: str, event) -> str:
    match event:
        case TokensEmitted():
            body = {"type": "tokens", "id": cid, "text": event.text, "token_ids": event.token_ids, "index": event.index}
        case Finished():
            body = {"type": "done", "id": cid, "finish_reason": event.finish_reason, "usage": event.usage}
        case Cancelled():
            body = {"type": "done", "id": cid, "finish_reason": "cancelled", "usage": event.usage}
        case Failed():
            body = {"type": "error", "id": cid, "error": msgspec.json.decode(error_body(event.error, event.status))["error"]}
    return msgspec.json.encode(body).decode()


async def _send_error(ws, cid: str | None, message: str, status: int, param: str | None = None) -> None:
    error = msgspec.json.decode(error_body(message, status, param))["error"]
    await ws.send_str(msgspec.json.encode({"type": "error", "id": cid, "error": error}).decode())


def _client_id(data: str) -> str | None:
    try:
        value = msgspec.json.decode(data)
        return value.get("id") if isinstance(value, dict) and isinstance(value.get("id"), str) else None
    except msgspec.DecodeError:
        return None
