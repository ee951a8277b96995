"""OpenAI-compatible endpoints: /v1/chat/completions and /v1/completions, JSON or SSE."""

from __future__ import annotations

import socket
from functools import lru_cache

import msgspec
from aiohttp import web

from runtime.actor import Rejected
from runtime.choices import choice_submits, merged_usage, open_choices
from runtime.gateway import QUEUE_TIMEOUT, SlowClient, new_request_id
from runtime.logprobs import TokenTexts
from runtime.messages import ActorFailure, Cancelled, Failed, Finished, Submit, TokensEmitted
from runtime.protocol import (
    ProtocolError, check_model, chat_messages, completion_prompt, decode_chat, decode_completion, sampling_params,
)
from runtime.responses import error_body
from runtime.shapes import Answer, Shape
from runtime.tools import call_grammar, check_tools

_encode = msgspec.json.encode
RETRY_AFTER_S = 1  # a 429's hint: slots free as requests end, usually within a few steps


def error_response(message: str, status: int, param: str | None = None) -> web.Response:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
    return web.Response(body=error_body(message, status, param), status=status, content_type="application/json",
                        headers=headers)


async def read_body(request: web.Request) -> bytes:
    limit = request.app["config"].server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ProtocolError(f"request body is larger than {limit} bytes", None, 413)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ProtocolError(f"request body is larger than {limit} bytes", None, 413) from None


@lru_cache(maxsize=4)
def token_texts(codec) -> TokenTexts:
    return TokenTexts(codec)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=False)


def _parse(request: web.Request, body: bytes, chat: bool):
    """The request and its Submit (choice 0's), or a ProtocolError naming what is wrong."""
    system, config = request.app["system"], request.app["config"]
    req = decode_chat(body) if chat else decode_completion(body)
    check_model(req.model, system.info.model_id)
    params = sampling_params(req, max_tokens_limit=config.admission.max_tokens_limit)
    rid = new_request_id("chatcmpl" if chat else "cmpl")
    if not chat:
        return req, Submit(request_id=rid, params=params, prompt=completion_prompt(req.prompt))
    tools, required = check_tools(req.tools, req.tool_choice)
    if required is not None:  # a call is required: the grammar makes it well formed
        if params.grammar is not None:
            raise ProtocolError("give response_format or a required tool_choice, not both", "tool_choice")
        params = msgspec.structs.replace(params, grammar=call_grammar(tools, required))
    tools = () if req.tool_choice == "none" else tools
    return req, Submit(request_id=rid, params=params, messages=chat_messages(req.messages), tools=tools)


async def _serve(request: web.Request, chat: bool) -> web.StreamResponse:
    system = request.app["system"]
    if system.failure:
        return error_response(f"server is degraded: {system.failure}", 503)
    try:
        req, submit = _parse(request, await read_body(request), chat)
    except ProtocolError as e:
        return error_response(e.message, e.status, e.param)
    texts = token_texts(system.codec) if submit.params.logprobs is not None else None
    shape = Shape(chat, system.info.model_id, submit.request_id, req, texts, tools=bool(submit.tools))
    submits = choice_submits(submit, req.n or 1)
    config = request.app["config"]
    pace = bool(req.stream) and (config.server.stream_pacing if req.stream_pacing is None else req.stream_pacing)
    try:
        async with open_choices(system, submits, config.admission.max_queue_wait_s, pace) as events:
            if req.stream:
                return await _stream(request, events, shape, len(submits))
            return await _collect(events, shape, len(submits))
    except Rejected as e:
        return error_response(e.message, e.status, e.param)
    except ActorFailure as e:
        return error_response(e.message, e.status)


def ended_error(event: Cancelled | Failed) -> tuple[str, int]:
    """A request that ended without its answer: the client's message and status."""
    if isinstance(event, Failed):
        return f"generation failed: {event.error}", event.status
    if event.reason == QUEUE_TIMEOUT:
        return ("request cancelled (queue_timeout): no first token within the server's max_queue_wait_s; "
                "the server is overloaded, retry later"), 503
    return f"request cancelled ({event.reason})", 503


async def _collect(events, shape: Shape, n: int) -> web.Response:
    answers = [Answer() for _ in range(n)]
    async for i, event in events:
        match event:
            case TokensEmitted():
                answers[i].parts.append(event.text)
                answers[i].logprobs += event.logprobs
            case Finished():
                answers[i].finish, answers[i].usage = event.finish_reason, event.usage
                if all(a.finish for a in answers):
                    whole = shape.whole(answers, merged_usage([a.usage for a in answers]))
                    return web.json_response(body=_encode(whole))
            case Cancelled() | Failed():
                return error_response(*ended_error(event))
    return error_response("request ended without a result", 500)


async def _stream(request: web.Request, events, shape: Shape, n: int) -> web.StreamResponse:
    async def produce(send) -> None:
        await _sse_events(send, events, shape, n)
        await send(b"data: [DONE]\n\n")

    return await stream_sse(request, events, produce)


async def stream_sse(request: web.Request, events, produce) -> web.StreamResponse:
    """An SSE response whose events `produce(send)` writes; each write waits for the client at most
    the slow-client timeout (the OpenAI and Anthropic endpoints both stream through it)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    bound_output(request)
    await response.prepare(request)
    timeout = request.app["config"].server.slow_client_timeout

    async def send(data: bytes) -> None:
        await events.deliver(response.write(data), timeout)

    try:
        await produce(send)
        await response.write_eof()
    except SlowClient:  # its request is cancelled as the handler leaves; nothing more can reach it
        abort_connection(request)
    return response


async def _sse_events(send, events, shape: Shape, n: int) -> None:
    first, usages = [True] * n, {}
    async for i, event in events:
        match event:
            case TokensEmitted():
                await send(_sse(shape.chunk(event.text, None, first[i], logprobs=event.logprobs, index=i)))
                first[i] = False
            case Finished():
                usages[i] = event.usage
                usage = merged_usage([usages[j] for j in range(n)]) if len(usages) == n else None
                await send(_sse(shape.finishing(event.finish_reason, first[i], i, usage)))
                if usage is not None and shape.usage_chunk:
                    await send(_sse(shape.usage_only(usage)))
            case Cancelled() | Failed():
                message, status = ended_error(event)
                await send(b"data: " + error_body(message, status) + b"\n\n")
                return  # the other choices are cancelled as the handler leaves


def _sse(payload) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def bound_output(request: web.Request) -> None:
    """Bound what a streaming connection buffers for its client, so a client that stops reading
    makes the writes wait (and the slow-client clock run) instead of piling output in the kernel."""
    size = request.app["config"].server.stream_buffer_bytes
    if request.transport is None:
        return
    if (sock := request.transport.get_extra_info("socket")) is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
    request.transport.set_write_buffer_limits(high=size)


def abort_connection(request: web.Request) -> None:
    """Drop a connection whose client stopped reading (a close would wait on the same full buffers)."""
    if request.transport is not None:
        request.transport.abort()
