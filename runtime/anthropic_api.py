"""Anthropic-style POST /v1/messages, JSON or its SSE event stream, so Claude-style clients work.

The same rule as the OpenAI endpoints: a field this server honours is used (model, max_tokens,
messages with text content, system, temperature, top_p, stop_sequences, stream, metadata.user_id,
and the extra disable_mtp); tools, tool_choice, thinking, top_k and non-text content are a 400 naming
them; unknown fields are a 400. Errors come in Anthropic's shape: {"type": "error", "error": {...}}.
A stream is message_start, content_block_start, content_block_delta per emission,
content_block_stop, message_delta (stop_reason, output usage), message_stop.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import web
from msgspec import Meta

from runtime.actor import Rejected
from runtime.gateway import open_request
from runtime.messages import ActorFailure, Cancelled, ChatMessage, Failed, Finished, SamplingParams, Submit, \
    TokensEmitted
from runtime.openai_api import ended_error, read_body, stream_sse
from runtime.protocol import MAX_MESSAGES, MAX_STOPS, ProtocolError, Stop, check_model, _decode_error

_encode = msgspec.json.encode
_ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}
_REFUSED = {"tools": "tool use is not implemented", "tool_choice": "tool use is not implemented",
            "thinking": "the model has no thinking setting", "top_k": "top_k sampling is not implemented"}


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class AnthropicMessage(_Wire, frozen=True, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(_Wire, frozen=True, kw_only=True):
    model: str
    max_tokens: Annotated[int, Meta(ge=1)]
    messages: Annotated[list[AnthropicMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]
    system: str | list[dict[str, Any]] | None = None
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    stop_sequences: Annotated[list[Stop], Meta(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    disable_mtp: bool = False  # extra, as on the OpenAI endpoints
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    top_k: int | None = None


_decoder = msgspec.json.Decoder(MessagesRequest)


def decode_messages(body: bytes) -> MessagesRequest:
    try:
        req = _decoder.decode(body)
    except msgspec.DecodeError as e:
        raise _decode_error(str(e)) from None
    for name, reason in _REFUSED.items():
        if getattr(req, name) not in (None, []):
            raise ProtocolError(f"{name} is not supported by this server ({reason}): omit it", name)
    return req


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if any(block.get("type") != "text" or not isinstance(block.get("text"), str) for block in content):
        raise ProtocolError(f"{where}: only text content blocks are supported", where)
    return "".join(block["text"] for block in content)


def to_submit(req: MessagesRequest, max_tokens_limit: int) -> Submit:
    if req.max_tokens > max_tokens_limit:
        raise ProtocolError(f"max_tokens must be in 1..{max_tokens_limit}, not {req.max_tokens}", "max_tokens")
    messages = [ChatMessage(role="system", content=_text(req.system, "system"))] if req.system else []
    messages += [ChatMessage(role=m.role, content=_text(m.content, f"messages[{i}].content"))
                 for i, m in enumerate(req.messages)]
    user = (req.metadata or {}).get("user_id")
    params = SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                            top_p=1.0 if req.top_p is None else req.top_p, max_tokens=req.max_tokens,
                            stop=tuple(req.stop_sequences or ()), disable_mtp=req.disable_mtp,
                            conversation=user if isinstance(user, str) else None)
    return Submit(request_id=f"msg_{uuid.uuid4().hex[:24]}", params=params, messages=tuple(messages))


def error_response(message: str, status: int) -> web.Response:
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.Response(body=_encode(body), status=status, content_type="application/json")


def stop_reason(event: Finished) -> tuple[str, str | None]:
    if event.stop is not None:
        return "stop_sequence", event.stop
    return ("max_tokens" if event.finish_reason == "length" else "end_turn"), None


def message_body(rid: str, model: str, text: str | None, usage, event: Finished | None) -> dict:
    reason, stop = stop_reason(event) if event is not None else (None, None)
    return {"id": rid, "type": "message", "role": "assistant", "model": model,
            "content": [] if text is None else [{"type": "text", "text": text}],
            "stop_reason": reason, "stop_sequence": stop,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}


async def messages(request: web.Request) -> web.StreamResponse:
    """Anthropic-style messages, JSON or SSE"""
    system, config = request.app["system"], request.app["config"]
    if system.failure:
        return error_response(f"server is degraded: {system.failure}", 503)
    try:
        req = decode_messages(await read_body(request))
        check_model(req.model, system.info.model_id)
        submit = to_submit(req, config.admission.max_tokens_limit)
    except ProtocolError as e:
        return error_response(e.message, e.status)
    try:
        async with open_request(system, submit, config.admission.max_queue_wait_s) as events:
            if req.stream:
                return await _stream(request, events, submit.request_id, system.info.model_id)
            return await _collect(events, submit.request_id, system.info.model_id)
    except (Rejected, ActorFailure) as e:
        return error_response(e.message, e.status)


async def _collect(events, rid: str, model: str) -> web.Response:
    parts = []
    async for event in events:
        match event:
            case TokensEmitted():
                parts.append(event.text)
            case Finished():
                usage = (event.usage.prompt_tokens, event.usage.completion_tokens)
                return web.json_response(body=_encode(message_body(rid, model, "".join(parts), usage, event)))
            case Cancelled() | Failed():
                return error_response(*ended_error(event))
    return error_response("request ended without a result", 500)


def _sse(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _encode({"type": kind, **data}) + b"\n\n"


async def _stream(request: web.Request, events, rid: str, model: str) -> web.StreamResponse:
    return await stream_sse(request, events, lambda send: _events(send, events, rid, model))


async def _events(send, events, rid: str, model: str) -> None:
    started = False
    async for event in events:
        if not started and isinstance(event, (TokensEmitted, Finished)):
            started = True
            prompt = events.prompt_tokens
            await send(_sse("message_start", {"message": message_body(rid, model, None, (prompt, 0), None)}))
            await send(_sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))
        match event:
            case TokensEmitted():
                if event.text:
                    await send(_sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                                                  "text": event.text}}))
            case Finished():
                reason, stop = stop_reason(event)
                await send(_sse("content_block_stop", {"index": 0}))
                await send(_sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": stop},
                                                  "usage": {"input_tokens": event.usage.prompt_tokens,
                                                            "output_tokens": event.usage.completion_tokens}}))
                await send(_sse("message_stop", {}))
            case Cancelled() | Failed():
                message, status = ended_error(event)
                kind = _ERROR_TYPES.get(status, "api_error")
                await send(_sse("error", {"error": {"type": kind, "message": message}}))
