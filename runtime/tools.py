"""Tool calling: the request's tools checked at the edge, the grammar that constrains a call where
tool_choice asks for one, and the parser that turns the model's output into tool_calls.

The tools reach the model through its own chat template (admission renders them; a template that
takes no tools is a 400). Calls are read in the convention such templates use (Hermes, Qwen,
SmolLM3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call. With
tool_choice "required" or a named function the output is constrained by an llguidance grammar to
exactly such a block whose arguments follow the function's parameters schema: a small model then
cannot get a call wrong, and speculation stays exact under the mask (runtime/grammar.py).
"""

from __future__ import annotations

import json
import uuid

import msgspec

from runtime.grammar import JSON_OPTIONS
from runtime.unsupported import ProtocolError

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


def check_tools(tools: list[dict] | None, choice) -> tuple[tuple[dict, ...], str | None]:
    """The function tools, and the name the call must have ("*": any of them; None: no call
    required). A 400 names what is malformed."""
    tools = tools or []
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ProtocolError("each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                                f"tools[{i}]")
        if not isinstance(fn.get("parameters", {}), dict):
            raise ProtocolError("a function's parameters must be a JSON schema object", f"tools[{i}].function")
        names.append(fn["name"])
    if choice in (None, "auto", "none"):
        return tuple(tools), None
    if choice == "required":
        required = "*"
    elif isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        required = choice["function"]["name"]
    else:
        raise ProtocolError("tool_choice must be none, auto, required or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}", "tool_choice")
    if not tools or (required != "*" and required not in names):
        raise ProtocolError(f"tool_choice asks for {required!r}, which is not among the tools", "tool_choice")
    return tuple(tools), required


def call_grammar(tools: tuple[dict, ...], required: str) -> str:
    """An llguidance grammar for exactly one call block of the required function (or any)."""
    import llguidance

    fns = [t["function"] for t in tools if required in ("*", t["function"]["name"])]
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": fn["name"]},
                             "arguments": fn.get("parameters") or {"type": "object"}}} for fn in fns]
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": JSON_OPTIONS}
    lark = f'start: "{OPEN}\\n" call "\\n{CLOSE}"\ncall: %json {json.dumps(schema)}'
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    if error := llguidance.LLMatcher.validate_grammar(grammar):
        raise ProtocolError(f"the tools' parameters cannot be compiled to a grammar: {error}", "tools")
    return grammar


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Splits streamed text into content and tool calls. Text that may be the start of a call
    block is held back until it is known not to be one (as stop strings are)."""

    def __init__(self):
        self.buffer = ""
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        """(content that may be shown now, calls completed by this delta)."""
        self.buffer += delta
        content, done = "", []
        while True:
            start = self.buffer.find(OPEN)
            if start < 0:
                keep = _partial_suffix(self.buffer, OPEN)
                content += self.buffer[:len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep:]
                return content, done
            end = self.buffer.find(CLOSE, start)
            if end < 0:
                content += self.buffer[:start]
                self.buffer = self.buffer[start:]
                return content, done
            content += self.buffer[:start]
            raw, call = self.buffer[start:end + len(CLOSE)], _parse(self.buffer[start + len(OPEN):end])
            self.buffer = self.buffer[end + len(CLOSE):]
            if call is None:  # not a well-formed call: it is shown as the text it is
                content += raw
            else:
                done.append(call)
                self.calls.append(call)

    def flush(self) -> str:
        """At the end: whatever is held (an unfinished block, or a partial marker) is content."""
        rest, self.buffer = self.buffer, ""
        return rest


def _parse(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(name=value["name"], arguments=json.dumps(arguments))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
