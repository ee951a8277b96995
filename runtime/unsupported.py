"""OpenAI fields this server does not implement, and the rule for them: a field is accepted only at
its neutral values (those that ask for nothing); any other value is a 400 naming it."""

from __future__ import annotations

import msgspec


class ProtocolError(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


class Unsupported(msgspec.Struct, frozen=True):
    """An OpenAI field this server does not implement: the values that ask for nothing, and why."""

    field: str
    neutral: tuple
    reason: str


_TOOLS = "the deprecated functions API is not implemented: use tools"
UNSUPPORTED = (
    Unsupported("functions", (None, []), _TOOLS),
    Unsupported("function_call", (None, "none", "auto"), _TOOLS),
    Unsupported("audio", (None,), "this server produces text only"),
    Unsupported("modalities", (None, ["text"]), "this server produces text only"),
    Unsupported("prediction", (None,), "predicted outputs are not implemented"),
    Unsupported("reasoning_effort", (None, "none"), "the model has no reasoning setting"),
    Unsupported("verbosity", (None,), "the model has no verbosity setting"),
    Unsupported("web_search_options", (None,), "web search is not available"),
    Unsupported("store", (None, False), "completions are not stored"),
    Unsupported("metadata", (None, {}), "completions are not stored"),
    Unsupported("service_tier", (None, "auto", "default"), "this server has one service tier"),
    Unsupported("prompt_cache_retention", (None,), "the prompt cache's bounds are the server's "
                "(--prompt-cache-size, --prompt-cache-bytes); per request: cache_prompt, cache_salt"),
    Unsupported("prompt_cache_options", (None,), "the prompt cache's bounds are the server's "
                "(--prompt-cache-size, --prompt-cache-bytes); per request: cache_prompt, cache_salt"),
    Unsupported("parallel_tool_calls", (None, True), "every tool call the model writes is returned; "
                "limiting a turn to one call is not implemented (tool_choice names one function)"),
    Unsupported("moderation", (None,), "moderation is not available"),
    Unsupported("best_of", (None, 1), "one completion per request"),
    Unsupported("suffix", (None, ""), "insertion (suffix) is not implemented"),
    Unsupported("stream_options.include_obfuscation", (None, False), "stream obfuscation is not implemented"),
    Unsupported("messages[].name", (None,), "the chat template has no speaker names"),
    Unsupported("messages[].function_call", (None,), _TOOLS),
    Unsupported("messages[].audio", (None,), "this server takes text only"),
    Unsupported("messages[].refusal", (None,), "refusal messages are not implemented"),
)
_TOP = tuple(u for u in UNSUPPORTED if "." not in u.field)
_MESSAGE = tuple(u for u in UNSUPPORTED if u.field.startswith("messages[]."))


def _refuse(owner, unsupported: tuple[Unsupported, ...], where: str = "") -> None:
    for u in unsupported:
        name = u.field.rsplit(".", 1)[-1]
        value = getattr(owner, name, None)
        if not any(_same(value, v) for v in u.neutral):
            shown = " or ".join("null" if v is None else msgspec.json.encode(v).decode() for v in u.neutral)
            raise ProtocolError(f"{where}{name} is not supported by this server ({u.reason}): omit it or send "
                                f"{shown}", f"{where}{name}")


def _same(a, b) -> bool:
    # JSON's false and 0 differ, Python's do not: a bool equals only a bool.
    return a is b if isinstance(a, bool) or isinstance(b, bool) else a == b


def refuse_unsupported(req) -> None:
    """A 400 naming the first unsupported field that asks for something (the module's rule)."""
    _refuse(req, _TOP)
    if getattr(req, "stream_options", None) is not None:
        _refuse(req.stream_options, tuple(u for u in UNSUPPORTED if u.field.startswith("stream_options.")),
                "stream_options.")
    for i, m in enumerate(getattr(req, "messages", None) or ()):
        _refuse(m, _MESSAGE, f"messages[{i}].")
