"""How the OpenAI endpoints dress results: ids, object names, where each choice's text and
log-probabilities go, and where usage goes in a stream (OpenAI's rules, README "Usage")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from runtime.logprobs import TokenTexts
from runtime.protocol import completion_prompt
from runtime.responses import (
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChunkChoice, Completion, CompletionChoice,
    Delta,
)


@dataclass
class Answer:
    """One choice's result as it is collected."""

    parts: list[str] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish: str | None = None
    usage: object = None


class Shape:
    def __init__(self, chat: bool, model: str, rid: str, req, texts: TokenTexts | None = None):
        self.chat, self.model, self.rid = chat, model, rid
        self.created = int(time.time())
        self.usage_chunk = bool(req.stream_options and req.stream_options.include_usage)
        self.echo = "" if chat or not req.echo else completion_prompt(req.prompt)  # completions: prompt first
        self.texts = texts  # where the request asked for log-probabilities
        self.offsets: dict[int, int] = {}  # completions' text_offset of each choice's next token

    def logprobs(self, logprobs, index: int = 0):
        if self.texts is None:
            return None
        if self.chat:
            return self.texts.chat(logprobs)
        out = self.texts.completion(logprobs, self.offsets.get(index, len(self.echo)))
        if out.tokens:
            self.offsets[index] = out.text_offset[-1] + len(out.tokens[-1])
        return out

    def chunk(self, text: str, finish: str | None, first: bool, usage=None, logprobs=(), index: int = 0):
        lp = self.logprobs(logprobs, index) if logprobs else None
        if self.chat:
            delta = Delta(role="assistant" if first else None, content=text if text or first else None)
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

    def whole(self, answers: list[Answer], usage):
        if self.chat:
            choices = [ChatChoice(index=i, message=AssistantMessage(content="".join(a.parts)), finish_reason=a.finish,
                                  logprobs=self.logprobs(a.logprobs, i)) for i, a in enumerate(answers)]
            return ChatCompletion(id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage)
        choices = [CompletionChoice(index=i, text=self.echo + "".join(a.parts), finish_reason=a.finish,
                                    logprobs=self.logprobs(a.logprobs, i)) for i, a in enumerate(answers)]
        return Completion(id=self.rid, created=self.created, model=self.model, usage=usage, choices=choices)
