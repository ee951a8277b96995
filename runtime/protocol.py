"""Wire types: OpenAI-compatible and WebSocket requests, decoded and checked at the edge.

Internal messages (runtime/messages.py) are built only from values that passed through here.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from runtime.messages import ChatMessage, SamplingParams

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_STOPS = 4


class ProtocolError(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


class ContentPart(msgspec.Struct, frozen=True):
    type: str
    text: str | None = None


class WireMessage(msgspec.Struct, frozen=True):
    role: str
    content: str | list[ContentPart] | None = None


Objective = Literal["latency", "energy", "balanced"]


class _Params(msgspec.Struct, frozen=True, kw_only=True):
    """Sampling fields every request kind shares (HTTP and WebSocket)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    disable_mtp: bool = False
    objective: Objective = "balanced"  # what the planner optimises for this request
    user: str | None = None  # OpenAI's end-user id
    conversation_id: str | None = None  # extra: groups the turns of one conversation


class _Sampling(_Params, frozen=True, kw_only=True):
    model: str | None = None
    n: int = 1
    stream: bool = False


class ChatRequest(_Sampling, frozen=True, kw_only=True):
    messages: list[WireMessage]
    max_completion_tokens: int | None = None


class CompletionRequest(_Sampling, frozen=True, kw_only=True):
    prompt: str | list[str]


class WsGenerate(_Params, frozen=True, kw_only=True, tag="generate"):
    id: str
    messages: list[WireMessage] | None = None
    prompt: str | None = None


class WsCancel(msgspec.Struct, frozen=True, kw_only=True, tag="cancel"):
    id: str


WsMessage = WsGenerate | WsCancel

_decoders = {t: msgspec.json.Decoder(t) for t in (ChatRequest, CompletionRequest)}
_ws_decoder = msgspec.json.Decoder(WsMessage)


def _decode(decoder: msgspec.json.Decoder, body: bytes):
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as e:
        # msgspec names the failing field as "at `$.field`": keep it, it is what a client needs.
        text = str(e)
        param = text.split("`$.", 1)[1].split("`", 1)[0] if "`$." in text else None
        raise ProtocolError(f"invalid request body: {text}", param) from None


def decode_chat(body: bytes) -> ChatRequest:
    return _decode(_decoders[ChatRequest], body)


def decode_completion(body: bytes) -> CompletionRequest:
    return _decode(_decoders[CompletionRequest], body)


def decode_ws(body: bytes | str) -> WsGenerate | WsCancel:
    return _decode(_ws_decoder, body.encode() if isinstance(body, str) else body)


def chat_messages(messages: list[WireMessage]) -> tuple[ChatMessage, ...]:
    if not messages:
        raise ProtocolError("messages must not be empty", "messages")
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise ProtocolError(f"messages[{i}].role {m.role!r} is not one of {sorted(ROLES)}", f"messages[{i}].role")
        out.append(ChatMessage(role=m.role, content=_content_text(m.content, i)))
    return tuple(out)


def _content_text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if any(p.type != "text" or p.text is None for p in content):
        raise ProtocolError(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
    return "".join(p.text for p in content)


def completion_prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ProtocolError("prompt: exactly one prompt per request is supported", "prompt")
        prompt = prompt[0]
    if not prompt:
        raise ProtocolError("prompt must not be empty", "prompt")
    return prompt


def ws_input(msg: WsGenerate) -> tuple[tuple[ChatMessage, ...] | None, str | None]:
    """A generate message's (messages, prompt): exactly one of them, checked as HTTP checks it."""
    if (msg.messages is None) == (msg.prompt is None):
        raise ProtocolError("give exactly one of messages or prompt", "messages")
    if msg.messages is not None:
        return chat_messages(msg.messages), None
    return None, completion_prompt(msg.prompt)


def sampling_params(req, max_tokens_default: int = 256, max_tokens_limit: int = 4096) -> SamplingParams:
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
    max_tokens = max_tokens_default if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= max_tokens_limit:
        raise ProtocolError(f"max_tokens must be in 1..{max_tokens_limit}, not {max_tokens}", "max_tokens")
    temperature = 1.0 if req.temperature is None else req.temperature
    if not 0.0 <= temperature <= 2.0:
        raise ProtocolError(f"temperature must be in [0, 2], not {temperature}", "temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0.0 < top_p <= 1.0:
        raise ProtocolError(f"top_p must be in (0, 1], not {top_p}", "top_p")
    if getattr(req, "n", 1) != 1:
        raise ProtocolError("only n=1 is supported", "n")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if len(stop) > MAX_STOPS:
        raise ProtocolError(f"at most {MAX_STOPS} stop sequences", "stop")
    return SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, stop=stop,
                          seed=req.seed, disable_mtp=req.disable_mtp, objective=req.objective,
                          conversation=req.conversation_id or req.user)


def error_body(message: str, status: int, param: str | None = None) -> bytes:
    kind = {429: "rate_limit_error", 404: "not_found_error"}.get(status,
                                                                 "invalid_request_error" if status < 500 else "server_error")
    return msgspec.json.encode({"error": {"message": message, "type": kind, "param": param, "code": status}})
