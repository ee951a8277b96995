"""The OpenAPI 3.1 document of the HTTP API, served at /openapi.json.

Schemas come from the wire types (runtime/protocol.py, runtime/responses.py) through
msgspec.json.schema_components; what a type cannot say is added here from the same sources: an
unsupported field's neutral values (protocol.UNSUPPORTED), this server's max_tokens limit and model
names. The WebSocket messages are components too, referenced from GET /v1/ws under x-websocket.
A route nobody described here still appears, from its handler's docstring, so the document covers
every route the app has.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from runtime.anthropic_api import MessagesRequest
from runtime.protocol import (
    EXTRAS, MAX_CHOICES, MODEL_ALIASES, UNSUPPORTED, ChatRequest, CompletionRequest, StreamOptions, WireMessage,
    WsMessage,
)
from runtime.responses import (
    ChatCompletion, ChatCompletionChunk, Completion, ErrorResponse, Health, ModelList, WsServerMessage,
)

REF = "#/components/schemas/{name}"
_STRUCTS = {"ChatRequest": ChatRequest, "CompletionRequest": CompletionRequest, "WireMessage": WireMessage,
            "StreamOptions": StreamOptions}
_ERRORS = {"400": "malformed, or asks for what this server does not do (param names the field)",
           "404": "no such model or route", "413": "the body is too large",
           "429": "the waiting queue is full (see Retry-After)",
           "503": "degraded, shutting down, or timed out in the queue"}
_EXTRA_DOCS = {"disable_mtp": "extra: this request decodes plainly (no speculation)",
               "objective": "extra: what the planner optimises for this request",
               "conversation_id": "extra: groups the turns of one conversation (acceptance evidence carries over)",
               "cache_prompt": "extra: false keeps this request out of the prompt cache (it neither reuses nor is kept)",
               "cache_salt": "extra: cached prefixes are shared only among requests with the same salt",
               "repetition_penalty": "extra: a prompt or output token's logit divided by it (positive) or "
                                     "multiplied (negative), as vLLM's",
               "stream_pacing": "extra: spread speculation's bursts of tokens over the measured inter-token "
                                "interval (unset: the server's --stream-pacing)"}


def document(app: web.Application) -> dict:
    config, info = app["config"], app["system"].info
    named = {"WsClientMessage": WsMessage, "WsServerMessage": WsServerMessage}
    types = [ChatRequest, CompletionRequest, ChatCompletion, ChatCompletionChunk, Completion, ErrorResponse,
             ModelList, Health, MessagesRequest, *named.values()]
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    components.update({name: schema for name, schema in zip(named, schemas[-len(named):])})
    components["AnthropicError"] = ANTHROPIC_ERROR
    _refine_messages(components, config.admission.max_tokens_limit, [info.model_id, *MODEL_ALIASES])
    _refine(components, config.admission.max_tokens_limit, [info.model_id, *MODEL_ALIASES])
    codec = getattr(app["system"], "codec", None)  # a test's stand-in system may have none
    _refine_tools(components["ChatRequest"]["properties"], bool(codec and codec.renders_tools))
    paths = _paths()
    for path, methods in _routes(app).items():
        for method, handler in methods.items():
            paths.setdefault(path, {}).setdefault(method, _undescribed(path, handler))
    doc = {"openapi": "3.1.0",
           "info": {"title": "metrale", "version": "0.1.0",
                    "description": "OpenAI-compatible serving with speculative decoding. Request fields: "
                                   "OpenAI's are honoured, or accepted only at their neutral values (any other "
                                   "value is a 400 naming the field); unknown fields are a 400 naming them; "
                                   f"this server's extras are {', '.join(EXTRAS)}."},
           "paths": paths, "components": {"schemas": components}}
    return _secure(doc, config.server.api_key)


def _secure(doc: dict, api_key: str | None) -> dict:
    """With --api-key: Bearer auth on every operation but /health's (runtime/auth.py)."""
    if api_key is None:
        return doc
    for path, methods in doc["paths"].items():
        for operation in methods.values():
            if path == "/health":
                operation["security"] = []
            else:
                operation.setdefault("responses", {})["401"] = {
                    "description": "missing or wrong API key", "content": _json("ErrorResponse")}
    doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return {**doc, "security": [{"bearer": []}]}


async def openapi_json(request: web.Request) -> web.Response:
    """This document."""
    return web.Response(body=msgspec.json.encode(document(request.app)), content_type="application/json")


def _refine(components: dict, max_tokens: int, models: list[str]) -> None:
    """What the types alone cannot say: neutral-only fields, the server's limits, descriptions."""
    owners = {"": ("ChatRequest", "CompletionRequest"), "messages[].": ("WireMessage",),
              "stream_options.": ("StreamOptions",)}
    for u in UNSUPPORTED:
        prefix, name = u.field.rpartition(".")[0], u.field.rpartition(".")[2]
        for owner in owners[prefix + "." if prefix else ""]:
            props = components[owner]["properties"]
            if name in props:
                props[name] = {"enum": _typed(u.neutral, owner, name), "default": None,
                               "description": f"not supported ({u.reason}): only these neutral values are accepted"}
    for owner in ("ChatRequest", "CompletionRequest", "WsGenerate"):
        props = components[owner]["properties"]
        for name in ("max_tokens", "max_completion_tokens"):
            if name in props:
                props[name] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": max_tokens}, {"type": "null"}],
                               "default": None}
        for name, text in _EXTRA_DOCS.items():
            if name in props:  # WebSocket messages take the sampling extras only
                props[name]["description"] = text
        if "n" in props:
            props["n"] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_CHOICES}, {"type": "null"}],
                          "default": None, "description": "choices of the prompt, each its own sequence"}
        if "model" in props:
            props["model"] = {"enum": [None, *models], "default": None,
                              "description": "the served model's id or an alias; any other is a 404"}
    for owner in ("ChatRequest", "WsGenerate"):
        components[owner]["properties"]["messages"].setdefault("minItems", 1)
    for owner in ("ChatRequest", "CompletionRequest"):
        components[owner]["properties"]["response_format"] = RESPONSE_FORMAT
    # top_logprobs asks for log-probabilities: with logprobs false it is a contradiction (a 400)
    components["ChatRequest"]["not"] = {"required": ["logprobs", "top_logprobs"],
                                        "properties": {"logprobs": {"const": False}, "top_logprobs": {"minimum": 1}}}
    part = components["ContentPart"]["properties"]
    part["type"] = {"enum": ["text"]}
    for name in ("image_url", "input_audio", "file", "refusal"):
        part[name] = {"type": "null", "default": None, "description": "only text parts are supported"}
    components["ContentPart"]["required"] = ["type", "text"]
    components["ContentPart"]["properties"]["text"] = {"type": "string"}
    components["CompletionRequest"]["properties"]["prompt"] = {
        "anyOf": [{"type": "string", "minLength": 1},
                  {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1}],
        "description": "one text prompt (a list holds exactly one)"}


# A json_schema's schema may be any JSON schema; the document shows simple ones (a fuzzer's random
# objects would be schemas no grammar can be compiled from: a 400 naming the field).
_SIMPLE_SCHEMA = {"type": "object", "additionalProperties": False,
                  "properties": {"type": {"enum": ["object", "string", "integer", "number", "boolean", "array"]}}}
RESPONSE_FORMAT = {"anyOf": [
    {"type": "object", "required": ["type"], "additionalProperties": False,
     "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"], "additionalProperties": False,
     "properties": {"type": {"const": "json_schema"}, "json_schema": {
         "type": "object", "required": ["name"], "additionalProperties": False,
         "properties": {"name": {"type": "string"}, "strict": {"type": "boolean"}, "schema": _SIMPLE_SCHEMA}}}},
    {"type": "null"}], "default": None,
    "description": "structured output: an llguidance grammar masks every path (README \"OpenAI features\")"}


def _refine_tools(props: dict, renders_tools: bool) -> None:
    """The tools and tool_choice shapes runtime/tools.py takes (their wire types are plain dicts); a
    model whose chat template renders no tools takes none (a 400 names tools)."""
    if not renders_tools:
        props["tools"] = {"enum": [None, []], "default": None,
                          "description": "this model's chat template renders no tools"}
        props["tool_choice"] = {"enum": [None, "none", "auto"], "default": None,
                                "description": "this model's chat template renders no tools"}
        return
    function = {"type": "object", "required": ["name"],
                "properties": {"name": {"type": "string", "minLength": 1}, "description": {"type": "string"},
                               "parameters": {"type": "object"}}}
    props["tools"] = {"anyOf": [{"type": "array", "items": {
        "type": "object", "required": ["type", "function"], "additionalProperties": False,
        "properties": {"type": {"const": "function"}, "function": function}}}, {"type": "null"}], "default": None}
    named = {"type": "object", "required": ["type", "function"],
             "properties": {"type": {"const": "function"}, "function": {
                 "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}
    props["tool_choice"] = {"anyOf": [{"enum": ["none", "auto", "required"]}, named, {"type": "null"}],
                            "default": None, "description": "required or a named function: one call, constrained "
                                                            "to the function's parameters; a name must be a tool's"}


def _typed(values: tuple, owner: str, name: str) -> list:
    """The neutral values that the field's own type can hold (completions' logprobs is an int, chat's a bool)."""
    kind = next(f.type for f in msgspec.structs.fields(_STRUCTS[owner]) if f.name == name)
    return [v for v in values if _fits(v, kind)]


def _fits(value, kind) -> bool:
    try:
        msgspec.convert(value, kind)
        return True
    except msgspec.ValidationError:
        return False


def _json(name: str) -> dict:
    return {"application/json": {"schema": {"$ref": REF.format(name=name)}}}


def _errors(*codes: str) -> dict:
    return {code: {"description": _ERRORS[code], "content": _json("ErrorResponse")} for code in codes}


def _completion(summary: str, request: str, whole: str, chunk: str) -> dict:
    event = {"anyOf": [{"$ref": REF.format(name=name)} for name in (chunk, "ErrorResponse")]}
    data = {"anyOf": [{"const": "[DONE]"},
                      {"type": "string", "contentMediaType": "application/json", "contentSchema": event}]}
    sse = {"schema": {"type": "object", "required": ["data"], "properties": {"data": data}},
           "description": f"stream=true: `data: <{chunk}>` events, an error object as an event if the request "
                          "fails mid-stream, then `data: [DONE]`"}
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": _json(request)},
                     "responses": {"200": {"description": "the completion, whole or as server-sent events",
                                           "content": {**_json(whole), "text/event-stream": sse}},
                                   **_errors("400", "404", "413", "429", "503")}}}


# /v1/messages answers in Anthropic's error shape (a 413 or 404 from the server itself in OpenAI's).
ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"],
                   "properties": {"type": {"const": "error"},
                                  "error": {"type": "object", "required": ["type", "message"],
                                            "properties": {"type": {"type": "string"},
                                                           "message": {"type": "string"}}}}}


def _refine_messages(components: dict, max_tokens: int, models: list[str]) -> None:
    """What MessagesRequest's types cannot say: text blocks only, the limits, the refused fields."""
    text = {"anyOf": [{"type": "string"}, {"type": "array", "items": {
        "type": "object", "required": ["type", "text"], "additionalProperties": False,
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}
    components["AnthropicMessage"]["properties"]["content"] = text
    props = components["MessagesRequest"]["properties"]
    props["system"] = {"anyOf": [text, {"type": "null"}], "default": None}
    props["max_tokens"] = {"type": "integer", "minimum": 1, "maximum": max_tokens}
    props["model"] = {"enum": models, "description": "the served model's id or an alias; any other is a 404"}
    for name in ("tool_choice", "thinking", "top_k"):
        props[name] = {"type": "null", "default": None, "description": "not supported: a 400 names it"}
    # An empty tool list asks for nothing, so it is taken as no tools (the server's neutral values).
    props["tools"] = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}], "default": None,
                      "description": "not supported: a non-empty list is a 400 naming it"}


def _messages() -> dict:
    either = {"anyOf": [{"$ref": REF.format(name="AnthropicError")}, {"$ref": REF.format(name="ErrorResponse")}]}
    errors = {code: {"description": _ERRORS[code], "content": {"application/json": {"schema": either}}}
              for code in ("400", "404", "413", "429", "503")}
    body = {"application/json": {"schema": {"type": "object", "description": "an Anthropic-style message"}},
            "text/event-stream": {"schema": {"type": "object", "required": ["event", "data"],
                                             "properties": {"event": {"type": "string"},
                                                            "data": {"type": "string",
                                                                     "contentMediaType": "application/json"}}},
                                  "description": "stream=true: message_start ... message_stop events"}}
    return {"post": {"summary": "Anthropic-style messages (README \"Anthropic-style messages\")",
                     "requestBody": {"required": True, "content": _json("MessagesRequest")},
                     "responses": {"200": {"description": "the message, whole or as server-sent events",
                                           "content": body}, **errors}}}


def _paths() -> dict:
    ws = ("A WebSocket (send Upgrade: websocket). Client frames are WsClientMessage (generate, cancel), "
          "server frames WsServerMessage (tokens, then done or error, per request id); several requests may "
          "share a socket and closing it cancels them. A plain GET is a 400.")
    return {
        "/v1/chat/completions": _completion("chat completion", "ChatRequest", "ChatCompletion", "ChatCompletionChunk"),
        "/v1/completions": _completion("text completion", "CompletionRequest", "Completion", "Completion"),
        "/v1/messages": _messages(),
        "/v1/models": {"get": {"summary": "the served model",
                               "responses": {"200": {"description": "one model", "content": _json("ModelList")}}}},
        "/v1/ws": {"get": {"summary": "token streaming over WebSocket", "description": ws,
                           "x-websocket": {"client": {"$ref": REF.format(name="WsClientMessage")},
                                           "server": {"$ref": REF.format(name="WsServerMessage")}},
                           "responses": {"101": {"description": "switching to the WebSocket protocol"},
                                         **_errors("400")}}},
        "/health": {"get": {"summary": "liveness and state",
                            "responses": {"200": {"description": "ok", "content": _json("Health")},
                                          "503": {"description": "degraded (an actor failed) or draining "
                                                                 "(shutting down)",
                                                  "content": _json("Health")}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "responses": {"200": {"description": "text exposition format",
                                                   "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/openapi.json": {"get": {"summary": "this document",
                                  "responses": {"200": {"description": "OpenAPI 3.1", "content": {
                                      "application/json": {"schema": {"type": "object"}}}}}}},
    }


def _routes(app: web.Application) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else None
        if path and route.method not in ("HEAD", "*"):
            out.setdefault(path, {})[route.method.lower()] = route.handler
    return out


def _undescribed(path: str, handler) -> dict:
    summary = ((handler.__doc__ or "").strip().splitlines() or [handler.__name__])[0]
    params = [{"name": p.strip("{}"), "in": "path", "required": True, "schema": {"type": "string"}}
              for p in path.split("/") if p.startswith("{")]
    return {"summary": summary, **({"parameters": params} if params else {}),
            "responses": {"200": {"description": summary},
                          "default": {"description": "an error", "content": _json("ErrorResponse")}}}
