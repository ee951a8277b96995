"""How the OpenAI endpoints dress results: ids, object names, where each choice's text and
log-probabilities go, and where usage goes in a stream (OpenAI's rules, README "Usage")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from runtime.logprobs import TokenTexts
from runtime.protocol import completion_prompt
from runtime.responses import (
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChunkChoice, Completion, CompletionChoice,
    Delta, DeltaToolCall, FunctionCall, ToolCallOut,
)
from runtime.tools import ToolCallParser, new_call_id


@dataclass
class Answer:
    """One choice's result as it is collected."""

    parts: list[str] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish: str | None = None
    usage: object = None


class Shape:
    def __init__(self, chat: bool, model: str, rid: str, req, texts: TokenTexts | None = None, tools: bool = False):
        self.chat, self.model, self.rid = chat, model, rid
        self.created = int(time.time())
        self.usage_chunk = bool(req.stream_options and req.stream_options.include_usage)
        self.echo = "" if chat or not req.echo else completion_prompt(req.prompt)  # completions: prompt first
        self.texts = texts  # where the request asked for log-probabilities
        self.offsets: dict[int, int] = {}  # completions' text_offset of each choice's next token
        self.parsers: dict[int, ToolCallParser] | None = {} if tools else None  # each choice's tool calls

    def logprobs(self, logprobs, index: int = 0):
        if self.texts is None:
            return None
        if self.chat:
            return self.texts.chat(logprobs)
        out = self.texts.completion(logprobs, self.offsets.get(index, len(self.echo)))
        if out.tokens:
            self.offsets[index] = out.text_offset[-1] + len(out.tokens[-1])
        return out

    def _parser(self, index: int) -> ToolCallParser:
        return self.parsers.setdefault(index, ToolCallParser())

    def _delta(self, text: str, first: bool, index: int, final: bool) -> Delta:
        """A chat delta; with tools, a call block's text leaves as a tool_calls delta once complete."""
        calls = None
        if self.parsers is not None:
            parser = self._parser(index)
            done_before = len(parser.calls)
            text, new = parser.feed(text)
            text += parser.flush() if final else ""
            calls = [DeltaToolCall(index=done_before + k, id=new_call_id(),
                                   function=FunctionCall(name=c.name, arguments=c.arguments))
                     for k, c in enumerate(new)] or None
        return Delta(role="assistant" if first else None, content=text if text or first else None, tool_calls=calls)

    def chunk(self, text: str, finish: str | None, first: bool, usage=None, logprobs=(), index: int = 0):
        lp = self.logprobs(logprobs, index) if logprobs else None
        if self.chat:
            delta = self._delta(text, first, index, final=finish is not None)
            if finish == "stop" and self.parsers is not None and self._parser(index).calls:
                finish = "tool_calls"
            return ChatCompletionChunk(id=self.rid, created=self.created, model=self.model, usage=usage,
                                       choices=[ChunkChoice(index=index, delta=delta, finish_reason=finish,
                                                            logprobs=lp)])
        text = self.echo + text if first else text
        return Completion(id=self.rid, created=self.created, model=self.model, usage=usage,
                          choices=[CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=lp)])

    def finishing(self, finish: str, first: bool, index: int, usage=None):
        """A choice's finishing chunk; without include_usage the request's last one carries usage."""
        return self.chunk("", finish, first, None if self.usage_chunk else usage, index=index)

    def usage_only(self, usage):
        """With include_usage: the chunk after every choice finished, no choices, the whole usage."""
        cls = ChatCompletionChunk if self.chat else Completion
        return cls(id=self.rid, created=self.created, model=self.model, choices=[], usage=usage)

    def message(self, text: str, finish: str) -> tuple[AssistantMessage, str]:
        """An answer's message, its tool calls read out where the request gave tools."""
        if self.parsers is None:
            return AssistantMessage(content=text), finish
        parser = ToolCallParser()
        content, calls = parser.feed(text)
        content += parser.flush()
        out = [ToolCallOut(id=new_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
               for c in calls]
        if not out:
            return AssistantMessage(content=content), finish
        return AssistantMessage(content=content or None, tool_calls=out), "tool_calls" if finish == "stop" else finish

    def whole(self, answers: list[Answer], usage):
        if self.chat:
            messages = [self.message("".join(a.parts), a.finish) for a in answers]
            choices = [ChatChoice(index=i, message=m, finish_reason=finish, logprobs=self.logprobs(a.logprobs, i))
                       for i, (a, (m, finish)) in enumerate(zip(answers, messages))]
            return ChatCompletion(id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage)
        choices = [CompletionChoice(index=i, text=self.echo + "".join(a.parts), finish_reason=a.finish,
                                    logprobs=self.logprobs(a.logprobs, i)) for i, a in enumerate(answers)]
        return Completion(id=self.rid, created=self.created, model=self.model, usage=usage, choices=choices)
