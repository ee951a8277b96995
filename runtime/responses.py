"""Wire types of what the server sends: OpenAI-shaped bodies and chunks, errors, WebSocket frames.

The handlers encode these structs, and /openapi.json is generated from the same ones, so the
document cannot drift from the responses.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from runtime.messages import FinishReason, Usage


class _Out(msgspec.Struct, frozen=True, kw_only=True):
    pass


class ErrorObject(_Out, frozen=True, kw_only=True):
    message: str
    type: str
    param: str | None
    code: int  # the HTTP status, also on SSE and WebSocket errors


class ErrorResponse(_Out, frozen=True, kw_only=True):
    error: ErrorObject


class TopLogprob(_Out, frozen=True, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class LogprobEntry(_Out, frozen=True, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Out, frozen=True, kw_only=True):
    """Chat's logprobs: one entry per emitted token (README "Log-probabilities")."""

    content: list[LogprobEntry] | None
    refusal: None = None


class CompletionLogprobs(_Out, frozen=True, kw_only=True):
    """Text completions' legacy logprobs."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class FunctionCall(_Out, frozen=True, kw_only=True):
    name: str
    arguments: str  # JSON text


class ToolCallOut(_Out, frozen=True, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaToolCall(_Out, frozen=True, kw_only=True):
    """A streamed call: each comes whole in one delta (name and all its arguments)."""

    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Out, frozen=True, kw_only=True, omit_defaults=True):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Out, frozen=True, kw_only=True):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(_Out, frozen=True, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(_Out, frozen=True, kw_only=True, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(_Out, frozen=True, kw_only=True):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(_Out, frozen=True, kw_only=True):
    """One SSE `data:` event. The chunk with finish_reason carries usage unless the request asked for
    stream_options.include_usage; then a last chunk with no choices carries it (OpenAI's form)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionChoice(_Out, frozen=True, kw_only=True):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class Completion(_Out, frozen=True, kw_only=True):
    """A whole text completion, or one SSE `data:` event of a streamed one (then usage as for chat)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Out, frozen=True, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "metrale"
    created: int = 0
    context_length: int


class ModelList(_Out, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(_Out, frozen=True, kw_only=True):
    """The fields of /health a monitor relies on; the body has more (scheduler and telemetry state)."""

    status: Literal["ok", "degraded", "draining"]  # draining: SIGTERM came, nothing new is admitted
    failure: str | None
    model: str
    mode: str
    uptime_s: float
    scheduler: dict[str, Any] | None
    prompt_cache: dict[str, Any] | None  # entries, bytes, bounds, queries, hits, hit_tokens, evictions, ...
    telemetry: dict[str, Any]
    # --distributed: state (ok | lost), lost (why), size, parallel, pids, commands, command_ms, collectives_ms
    distributed: dict[str, Any] | None = None
    owner_ms: dict[str, Any] | None = None  # per model-owner command kind: count, mean_ms


# --- WebSocket: server -> client ---------------------------------------------------------------

class WsTokens(_Out, frozen=True, kw_only=True, tag="tokens"):
    id: str
    text: str
    token_ids: list[int]
    index: int  # position of the first of token_ids in the completion
    logprobs: list[LogprobEntry] | None = None  # one per token, where the request asked for logprobs


class WsDone(_Out, frozen=True, kw_only=True, tag="done"):
    id: str
    finish_reason: FinishReason
    usage: Usage


class WsError(_Out, frozen=True, kw_only=True, tag="error"):
    id: str | None  # null when the message that failed had no readable id
    error: ErrorObject


WsServerMessage = WsTokens | WsDone | WsError


def error_object(message: str, status: int, param: str | None = None) -> ErrorObject:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error")
    return ErrorObject(message=message, type=kind, param=param, code=status)


def error_body(message: str, status: int, param: str | None = None) -> bytes:
    return msgspec.json.encode(ErrorResponse(error=error_object(message, status, param)))
