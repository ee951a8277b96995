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
_TAIL = len(TOOL_CLOSE)  # enough of the text's end to hold either tool marker


class Phase(enum.Enum):
    THINK = "think"
    ANSWER = "answer"
    CODE = "code"
    TOOL = "tool"


class PhaseTracker(msgspec.Struct, kw_only=True):
    in_fence: bool = False
    in_tool: bool = False
    json_output: bool | None = None  # decided by the first non-blank character of the output
    ticks: int = 0  # backticks in a row since the last fence (three make one)
    tail: str = ""  # the last characters, to find tool markers split across deltas

    def advance(self, delta: str) -> None:
        """Scan left to right, one character at a time, so the phase does not depend on how the
        text was cut into deltas (a run of backticks makes fences three at a time)."""
        if self.json_output is None and delta.strip():
            self.json_output = delta.lstrip()[0] in "{["
        for ch in delta:
            self.ticks = self.ticks + 1 if ch == "`" else 0
            if self.ticks == len(FENCE):
                self.ticks = 0
                self.in_fence = self.in_fence if self.in_tool else not self.in_fence
            self.tail = (self.tail + ch)[-_TAIL:]
            if self.tail.endswith(TOOL_OPEN):
                self.in_tool = True
            elif self.tail.endswith(TOOL_CLOSE):
                self.in_tool = False

    def phase(self, inside_think: bool) -> Phase:
        if inside_think:
            return Phase.THINK
        if self.in_tool or self.json_output:
            return Phase.TOOL
        return Phase.CODE if self.in_fence else Phase.ANSWER
