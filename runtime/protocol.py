"""Wire types: OpenAI-compatible and WebSocket requests, decoded and checked at the edge.

One rule for every request field (README "Request fields"): a field this server honours is used;
a field of OpenAI's schema that it does not implement is accepted only at its neutral value (absent,
null, or the value that asks for nothing: logprobs false, presence_penalty 0, response_format text)
and any other value is a 400 naming it; a field outside OpenAI's schema and this server's extras
(disable_mtp, objective, conversation_id) is a 400 naming it. Nothing is silently ignored.
Internal messages (runtime/messages.py) are built only from values that passed through here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from runtime.grammar import grammar_for
from runtime.messages import ChatMessage, SamplingParams
from runtime.unsupported import UNSUPPORTED, ProtocolError, refuse_unsupported  # noqa: F401 (re-exported)

MAX_STOPS = 4
MAX_STOP_CHARS = 256
MAX_MESSAGES = 2048  # a chat template renders every message: bound the work one body can ask for
MAX_ID_CHARS = 256
SEED_RANGE = 1 << 63  # MLX's random keys take 0..2^63-1: any int64 seed is taken modulo this
MODEL_ALIASES = ("default",)  # besides the served model's id
EXTRAS = ("disable_mtp", "objective", "conversation_id", "cache_prompt", "cache_salt", "repetition_penalty",
          "stream_pacing")
MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 8  # n: each choice is a sequence of its own in the scheduler

Role = Literal["system", "user", "assistant", "tool", "developer"]
Objective = Literal["latency", "energy", "balanced"]
Identifier = Annotated[str, Meta(max_length=MAX_ID_CHARS)]
Stop = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_CHARS)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
# logit_bias keys: a token id in decimal, as OpenAI's clients send it (the document says so, and decoding checks it)
TokenIdKey = Annotated[str, Meta(pattern="^[0-9]{1,9}$")]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ContentPart(_Wire, frozen=True, kw_only=True):
    type: str
    text: str | None = None
    image_url: dict[str, Any] | None = None
    input_audio: dict[str, Any] | None = None
    file: dict[str, Any] | None = None
    refusal: str | None = None


class WireMessage(_Wire, frozen=True, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    refusal: str | None = None


class StreamOptions(_Wire, frozen=True, kw_only=True):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class _Params(_Wire, frozen=True, kw_only=True):
    """Sampling fields every request kind shares (HTTP and WebSocket)."""

    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    max_tokens: int | None = None
    stop: Stop | Annotated[list[Stop], Meta(max_length=MAX_STOPS)] | None = None
    seed: int | None = None
    disable_mtp: bool = False  # extra: this request decodes plainly
    objective: Objective = "balanced"  # extra: what the planner optimises for this request
    user: Identifier | None = None  # OpenAI's end-user id
    conversation_id: Identifier | None = None  # extra: groups the turns of one conversation
    cache_prompt: bool = True  # extra (llama.cpp's name): false keeps this request out of the prompt cache
    cache_salt: Identifier | None = None  # extra (vLLM's name): prefixes are shared only within one salt
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    # extra: vLLM's, over prompt and output; from 0.1 so no logit grows past 10x (a subnormal one made inf)
    repetition_penalty: Annotated[float, Meta(ge=0.1, le=10)] | None = None
    stream_pacing: bool | None = None  # extra: spread speculation's bursts evenly (unset: the server's default)
    logit_bias: dict[TokenIdKey, Annotated[float, Meta(ge=-100, le=100)]] | None = None  # token id -> bias (OpenAI's range)


class _OpenAI(_Params, frozen=True, kw_only=True):
    """What chat and text completions share beyond the sampling fields."""

    model: str | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None


class ChatRequest(_OpenAI, frozen=True, kw_only=True):
    messages: Annotated[list[WireMessage], Meta(max_length=MAX_MESSAGES)]
    max_completion_tokens: int | None = None
    safety_identifier: Identifier | None = None
    prompt_cache_key: Identifier | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None


class CompletionRequest(_OpenAI, frozen=True, kw_only=True):
    prompt: str | list[str]
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    logprobs: TopLogprobs | None = None
    response_format: dict[str, Any] | None = None  # extra here (chat's field; vLLM takes it on completions too)


class WsGenerate(_Params, frozen=True, kw_only=True, tag="generate"):
    id: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
    messages: Annotated[list[WireMessage], Meta(max_length=MAX_MESSAGES)] | None = None
    prompt: str | None = None
    logprobs: TopLogprobs | None = None  # as completions': alternatives per token, in each tokens frame
    response_format: dict[str, Any] | None = None  # json_object / json_schema, as chat's


class WsCancel(_Wire, frozen=True, kw_only=True, tag="cancel"):
    id: Annotated[str, Meta(max_length=MAX_ID_CHARS)]


WsMessage = WsGenerate | WsCancel


_decoders = {t: msgspec.json.Decoder(t) for t in (ChatRequest, CompletionRequest)}
_ws_decoder = msgspec.json.Decoder(WsMessage)


def _decode(decoder: msgspec.json.Decoder, body: bytes):
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as e:
        raise _decode_error(str(e)) from None


def _decode_error(text: str) -> ProtocolError:
    # msgspec names the failing field as "at `$.field`": keep it, it is what a client needs.
    at = text.split("`$.", 1)[1].split("`", 1)[0] if "`$." in text else None
    at = at.replace("[...]", "") if at else at  # a map's value ("logit_bias[...]"): the map's name
    if text.startswith("Object contains unknown field `"):
        name = text.split("`", 2)[1]
        param = f"{at}.{name}" if at else name
        return ProtocolError(f"unknown field {param!r}: not an OpenAI field nor one of this server's extras "
                             f"({', '.join(EXTRAS)}); this server refuses what it would otherwise ignore "
                             "(see /openapi.json)", param)
    return ProtocolError(f"invalid request body: {text}", at)


def decode_chat(body: bytes) -> ChatRequest:
    req = _decode(_decoders[ChatRequest], body)
    refuse_unsupported(req)
    return req


def decode_completion(body: bytes) -> CompletionRequest:
    req = _decode(_decoders[CompletionRequest], body)
    refuse_unsupported(req)
    return req


def decode_ws(body: bytes | str) -> WsGenerate | WsCancel:
    msg = _decode(_ws_decoder, body.encode() if isinstance(body, str) else body)
    refuse_unsupported(msg)
    return msg


def check_model(requested: str | None, served: str) -> None:
    """A model name asks for that model: one this server does not serve is a 404, not a substitute."""
    if requested and requested != served and requested not in MODEL_ALIASES:
        raise ProtocolError(f"model {requested!r} is not served here; this server serves {served!r} "
                            f"(or ask for {MODEL_ALIASES[0]!r})", "model", 404)


def chat_messages(messages: list[WireMessage]) -> tuple[ChatMessage, ...]:
    if not messages:
        raise ProtocolError("messages must not be empty", "messages")
    return tuple(ChatMessage(role=m.role, content=_content_text(m.content, i),
                             tool_calls=tuple(m.tool_calls) if m.tool_calls else None, tool_call_id=m.tool_call_id)
                 for i, m in enumerate(messages))


def _content_text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if any(p.type != "text" or p.text is None or (p.image_url, p.input_audio, p.file, p.refusal) != (None,) * 4
           for p in content):
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
    field = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
    max_tokens = getattr(req, field)
    max_tokens = min(max_tokens_default, max_tokens_limit) if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= max_tokens_limit:
        raise ProtocolError(f"{field} must be in 1..{max_tokens_limit}, not {max_tokens}", field)
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    # The conversation key groups requests whose acceptance evidence carries over (README).
    conversation = (req.conversation_id or getattr(req, "prompt_cache_key", None) or req.user
                    or getattr(req, "safety_identifier", None))
    return SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                          top_p=1.0 if req.top_p is None else req.top_p, max_tokens=max_tokens, stop=stop,
                          seed=None if req.seed is None else req.seed % SEED_RANGE, disable_mtp=req.disable_mtp,
                          objective=req.objective, conversation=conversation, cache_prompt=req.cache_prompt,
                          cache_salt=req.cache_salt,
                          presence_penalty=getattr(req, "presence_penalty", None) or 0.0,
                          frequency_penalty=getattr(req, "frequency_penalty", None) or 0.0,
                          repetition_penalty=getattr(req, "repetition_penalty", None) or 1.0,
                          logprobs=requested_logprobs(req),
                          grammar=grammar_for(getattr(req, "response_format", None)),
                          logit_bias=logit_bias(getattr(req, "logit_bias", None)))


def logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} as sorted (id, bias) pairs; ids past the vocabulary are admission's 400."""
    pairs = []  # keys are decimal ids already: TokenIdKey is checked as the body is decoded
    for key, value in (bias or {}).items():
        if value:
            pairs.append((int(key), float(value)))
    return tuple(sorted(pairs))


def requested_logprobs(req) -> int | None:
    """The alternatives per token a request asks for; None where it asks for no log-probabilities.
    Chat: logprobs true, top_logprobs alternatives (OpenAI refuses top_logprobs without logprobs);
    completions: logprobs is the number of alternatives."""
    logprobs = getattr(req, "logprobs", None)
    if not hasattr(req, "top_logprobs"):
        return logprobs
    if req.top_logprobs and logprobs is False:
        raise ProtocolError("top_logprobs asks for log-probabilities, logprobs false for none", "top_logprobs")
    return (req.top_logprobs or 0) if logprobs or req.top_logprobs else None

