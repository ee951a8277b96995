"""OpenAI-compatible endpoints: /v1/chat/completions and /v1/completions, JSON or SSE."""

from __future__ import annotations

import time

import msgspec
from aiohttp import web

from runtime.actor import Rejected
from runtime.gateway import new_request_id, open_request
from runtime.messages import ActorFailure, Cancelled, Failed, Finished, Submit, TokensEmitted
from runtime.protocol import (
    ProtocolError, chat_messages, completion_prompt, decode_chat, decode_completion, error_body,
    sampling_params,
)

_encode = msgspec.json.encode


def error_response(message: str, status: int, param: str | None = None) -> web.Response:
    return web.Response(body=error_body(message, status, param), status=status, content_type="application/json")


async def read_body(request: web.Request) -> bytes:
    limit = request.app["config"].server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ProtocolError(f"request body is larger than {limit} bytes", None, 413)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ProtocolError(f"request body is larger than {limit} bytes", None, 413) from None


class _Shape:
    """How one endpoint dresses its results: ids, object names, where the text goes."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.created = int(time.time())

    def chunk(self, rid: str, text: str, finish: str | None, first: bool) -> dict:
        if self.chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return {"id": rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [choice]}
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return {"id": rid, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [choice]}

    def whole(self, rid: str, text: str, finish: str, usage) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        return {"id": rid, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": msgspec.to_builtins(usage)}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=False)


async def _serve(request: web.Request, chat: bool) -> web.StreamResponse:
    system = request.app["system"]
    if system.failure:
        return error_response(f"server is degraded: {system.failure}", 503)
    try:
        body = await read_body(request)
        req = decode_chat(body) if chat else decode_completion(body)
        params = sampling_params(req, max_tokens_limit=request.app["config"].admission.max_tokens_limit)
        rid = new_request_id("chatcmpl" if chat else "cmpl")
        submit = (Submit(request_id=rid, params=params, messages=chat_messages(req.messages)) if chat
                  else Submit(request_id=rid, params=params, prompt=completion_prompt(req.prompt)))
    except ProtocolError as e:
        return error_response(e.message, e.status, e.param)
    shape = _Shape(chat, system.info.model_id)
    try:
        async with open_request(system, submit) as events:
            if req.stream:
                return await _stream(request, rid, events, shape)
            return await _collect(rid, events, shape)
    except Rejected as e:
        return error_response(e.message, e.status, e.param)
    except ActorFailure as e:
        return error_response(e.message, e.status)


async def _collect(rid: str, events, shape: _Shape) -> web.Response:
    parts = []
    async for event in events:
        match event:
            case TokensEmitted():
                parts.append(event.text)
            case Finished():
                return web.json_response(body=_encode(shape.whole(rid, "".join(parts), event.finish_reason, event.usage)))
            case Cancelled():
                return error_response(f"request cancelled ({event.reason})", 503)
            case Failed():
                return error_response(f"generation failed: {event.error}", event.status)
    return error_response("request ended without a result", 500)


async def _stream(request: web.Request, rid: str, events, shape: _Shape) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    first = True
    async for event in events:
        match event:
            case TokensEmitted():
                await _sse(response, shape.chunk(rid, event.text, None, first))
                first = False
            case Finished():
                last = shape.chunk(rid, "", event.finish_reason, first) | {"usage": msgspec.to_builtins(event.usage)}
                await _sse(response, last)
            case Cancelled():
                await _sse(response, msgspec.json.decode(error_body(f"request cancelled ({event.reason})", 503)))
            case Failed():
                await _sse(response, msgspec.json.decode(error_body(f"generation failed: {event.error}", event.status)))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _sse(response: web.StreamResponse, payload: dict) -> None:
    await response.write(b"data: " + _encode(payload) + b"\n\n")
