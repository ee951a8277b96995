"""WebSocket token streaming at /v1/ws: several requests per socket, each under the client's id.

Client -> server (JSON text frames): {"type": "generate", "id": ..., "messages" | "prompt": ...,
                  sampling fields} and {"type": "cancel", "id": ...}
Server -> client: {"type": "tokens", "id", "text", "token_ids", "index"[, "logprobs"]} per emitted batch,
                  then one of {"type": "done", "id", "finish_reason", "usage"} (finish_reason "cancelled"
                  after the client's cancel) or {"type": "error", "id", "error": {...}} (a failure,
                  or a cancel that was not the client's: shutdown, queue_timeout). Closing the socket
                  cancels its requests.
Limits: a frame larger than max_body_bytes closes the socket (1009); more than ws_max_open
requests open at once on a socket, a binary frame, or a cancel of an id that is not open get an
error frame and the socket stays open. A client that takes no frame for slow_client_timeout
seconds has its socket closed and its requests cancelled (slow_client). With --api-key set, the
upgrade request needs the Bearer header (runtime/auth.py). The message types are in /openapi.json.
A generate takes the HTTP API's sampling and processing fields (penalties, logit_bias,
response_format, logprobs as completions' count of alternatives, stream_pacing); tools and n are
the HTTP API's only.
"""

from __future__ import annotations

import asyncio

import msgspec
from aiohttp import WSMsgType, web

from runtime.actor import Rejected
from runtime.gateway import SlowClient, new_request_id, open_request
from runtime.messages import ActorFailure, Cancel, Cancelled, Failed, Finished, Submit, TokensEmitted
from runtime.openai_api import abort_connection, bound_output, ended_error, error_response, token_texts
from runtime.pacing import paced
from runtime.protocol import ProtocolError, WsCancel, WsGenerate, decode_ws, sampling_params, ws_input
from runtime.responses import WsDone, WsError, WsTokens, error_object

_encode = msgspec.json.encode


async def websocket(request: web.Request) -> web.StreamResponse:
    server = request.app["config"].server
    ws = web.WebSocketResponse(heartbeat=30, max_msg_size=server.max_body_bytes,
                               writer_limit=server.stream_buffer_bytes)  # a send waits once this much is unread
    if not ws.can_prepare(request).ok:
        return error_response("this endpoint speaks WebSocket: send a GET with Upgrade: websocket", 400)
    bound_output(request)
    await ws.prepare(request)
    tasks: dict[str, tuple[asyncio.Task, str]] = {}  # client id -> (its task, request id)
    try:
        async for frame in ws:
            if frame.type == WSMsgType.TEXT:
                await _on_message(request, ws, frame.data, tasks)
            elif frame.type == WSMsgType.BINARY:
                await _send_error(ws, None, "binary frames are not accepted: send JSON text frames", 400)
    finally:
        running = [task for task, _ in tasks.values()]
        for task in running:
            task.cancel()  # open_request cancels the request when its task is cancelled
        await asyncio.gather(*running, return_exceptions=True)
    return ws


async def _on_message(request, ws, data: str, tasks: dict) -> None:
    system, config = request.app["system"], request.app["config"]
    try:
        msg = decode_ws(data)
        if isinstance(msg, WsCancel):
            if msg.id not in tasks:
                raise ProtocolError(f"no request with id {msg.id!r} is open on this socket (it may have ended)", "id")
            # The Cancelled event then reaches the client as its "done".
            system.scheduler.tell_nowait(Cancel(request_id=tasks[msg.id][1], reason="client"))
            return
        if msg.id in tasks:
            raise ProtocolError(f"id {msg.id!r} is already in use on this socket", "id")
        if len(tasks) >= config.server.ws_max_open:
            raise ProtocolError(f"this socket has {len(tasks)} requests open, its limit; wait for one to end "
                                "or open another socket", "id", 429)
        submit = _submit(msg, config.admission.max_tokens_limit)
    except ProtocolError as e:
        await _send_error(ws, _client_id(data), e.message, e.status, e.param)
        return
    pace = config.server.stream_pacing if msg.stream_pacing is None else msg.stream_pacing
    task = asyncio.create_task(_run(request, ws, msg.id, submit, pace))
    tasks[msg.id] = (task, submit.request_id)
    task.add_done_callback(lambda _t, cid=msg.id: tasks.pop(cid, None))


def _submit(msg: WsGenerate, max_tokens_limit: int) -> Submit:
    params = sampling_params(msg, max_tokens_limit=max_tokens_limit)
    messages, prompt = ws_input(msg)
    return Submit(request_id=new_request_id("ws"), params=params, messages=messages, prompt=prompt)


async def _run(request: web.Request, ws: web.WebSocketResponse, cid: str, submit: Submit, pace: bool) -> None:
    system, config = request.app["system"], request.app["config"]
    texts = token_texts(system.codec) if submit.params.logprobs is not None else None
    try:
        async with open_request(system, submit, config.admission.max_queue_wait_s) as events:
            async for event in (paced(events) if pace else events):
                await events.deliver(ws.send_str(_frame(cid, event, texts)), config.server.slow_client_timeout)
    except SlowClient:  # the client stopped reading: close the socket (its other requests end too)
        abort_connection(request)
    except Rejected as e:
        await _send_error(ws, cid, e.message, e.status, e.param)
    except ActorFailure as e:
        await _send_error(ws, cid, e.message, e.status)
    except ConnectionResetError:
        pass


def _frame(cid: str, event, texts=None) -> str:
    match event:
        case TokensEmitted():
            body = WsTokens(id=cid, text=event.text, token_ids=list(event.token_ids), index=event.index,
                            logprobs=[texts.entry(lp) for lp in event.logprobs] if texts is not None else None)
        case Finished():
            body = WsDone(id=cid, finish_reason=event.finish_reason, usage=event.usage)
        case Cancelled() if event.reason == "client":
            body = WsDone(id=cid, finish_reason="cancelled", usage=event.usage)
        case Cancelled() | Failed():  # not the client's doing: an error says why
            body = WsError(id=cid, error=error_object(*ended_error(event)))
    return _encode(body).decode()


async def _send_error(ws, cid: str | None, message: str, status: int, param: str | None = None) -> None:
    if not ws.closed:
        await ws.send_str(_encode(WsError(id=cid, error=error_object(message, status, param))).decode())


def _client_id(data: str) -> str | None:
    try:
        value = msgspec.json.decode(data)
        return value.get("id") if isinstance(value, dict) and isinstance(value.get("id"), str) else None
    except msgspec.DecodeError:
        return None
