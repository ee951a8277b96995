"""Where a generation stands in its content: reasoning, prose, code or a tool call.

Acceptance depends on what is being written (a draft head that guesses prose poorly may guess code
well), so the controller keeps its acceptance estimates per phase. The phase is read from the
emitted text as it streams:
- THINK: inside <think> ... </think> (from the token-level ThinkProgress the scheduler keeps);
- CODE: inside a ``` fenced block;
- TOOL: inside <tool_call> ... </tool_call>, or an output that opened with a JSON object or array;
- ANSWER: anything else.

Pure: text in, phase out.
"""

from __future__ import annotations

import enum

import msgspec

FENCE = "```"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_TAIL = max(len(FENCE), len(TOOL_CLOSE)) - 1  # a marker may straddle two text deltas


class Phase(enum.Enum):
    THINK = "think"
    ANSWER = "answer"
    CODE = "code"
    TOOL = "tool"


class PhaseTracker(msgspec.Struct, kw_only=True):
    in_fence: bool = False
    in_tool: bool = False
    json_output: bool | None = None  # decided by the first non-blank character of the output
    tail: str = ""  # the end of the text seen so far, to find markers split across deltas

    def advance(self, delta: str) -> None:
        if not delta:
            return
        if self.json_output is None and delta.strip():
            self.json_output = delta.lstrip()[0] in "{["
        text, start = self.tail + delta, len(self.tail)
        for marker in _markers_in(text, start):
            if marker == FENCE and not self.in_tool:
                self.in_fence = not self.in_fence
            elif marker == TOOL_OPEN:
                self.in_tool = True
            elif marker == TOOL_CLOSE:
                self.in_tool = False
        self.tail = text[-_TAIL:]

    def phase(self, inside_think: bool) -> Phase:
        if inside_think:
            return Phase.THINK
        if self.in_tool or self.json_output:
            return Phase.TOOL
        return Phase.CODE if self.in_fence else Phase.ANSWER


def _markers_in(text: str, start: int) -> list[str]:
    """Markers in text that end past `start` (those before it were counted with the last delta)."""
    found = []
    for marker in (FENCE, TOOL_OPEN, TOOL_CLOSE):
        i = text.find(marker)
        while i != -1:
            if i + len(marker) > start:
                found.append((i, marker))
            i = text.find(marker, i + len(marker))
    return [m for _, m in sorted(found)]
