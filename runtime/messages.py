"""Typed messages between actors. Commands are imperative, events past tense; all frozen.

msgspec does not check types at construction: wire input is decoded in runtime/protocol.py.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import msgspec

FinishReason = Literal["stop", "length", "cancelled", "error", "tool_calls"]  # tool_calls: set at the edge


class Msg(msgspec.Struct, frozen=True, tag=True, kw_only=True):
    pass


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    disable_mtp: bool = False
    objective: str = "balanced"  # "latency" | "energy" | "balanced"
    conversation: str | None = None  # conversation_id if given, else the OpenAI user
    cache_prompt: bool = True  # False: this request neither reuses the prompt cache nor is kept in it
    cache_salt: str | None = None  # only requests with the same salt share cached prefixes
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # the alternatives per token to report; None: no log-probabilities
    grammar: str | None = None  # llguidance grammar of response_format (runtime/grammar.py); None: free text
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), OpenAI's logit_bias

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processed(self) -> bool:
        """Whether the owner processes this sequence's logits (penalties) or reports log-probabilities."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logprobs is not None or self.grammar is not None or bool(self.logit_bias))


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    content: str
    tool_calls: tuple[dict, ...] | None = None  # an assistant turn's calls, as the client sent them
    tool_call_id: str | None = None  # a tool turn: the call it answers


# --- server -> admission -> scheduler ------------------------------------------------------

class Submit(Msg, frozen=True):
    request_id: str
    params: SamplingParams
    messages: tuple[ChatMessage, ...] | None = None  # chat completions
    prompt: str | None = None  # text completions
    submitted_at: float = 0.0
    tools: tuple[dict, ...] = ()  # rendered through the chat template (runtime/tools.py)


class Admitted(Msg, frozen=True):
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    submitted_at: float


class Cancel(Msg, frozen=True):
    request_id: str
    reason: str = "client"


# --- scheduler -> streamer -> client ---------------------------------------------------------

class Subscribe(Msg, frozen=True):
    """Route a request's events to queue (the client's, in-process only: never encoded)."""

    request_id: str
    queue: asyncio.Queue


class Unsubscribe(Msg, frozen=True):
    request_id: str


class SpecReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """What speculation did for one request; zero everywhere when it never ran."""

    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_position: tuple[int, ...] = ()
    drafted_by_position: tuple[int, ...] = ()
    verify_steps: int = 0
    plain_steps: int = 0
    verify_seconds: float = 0.0
    plain_seconds: float = 0.0
    forced_tokens: int = 0  # structured output: tokens the grammar forced, verified as free drafts (not counted above)


class PromptTokensDetails(msgspec.Struct, frozen=True, kw_only=True):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prompt cache (OpenAI's field)


class CompletionTokensDetails(msgspec.Struct, frozen=True, kw_only=True):
    """OpenAI's usage.completion_tokens_details, where the speculation receipt is documented to live
    (README "Usage"): its prediction counts are the drafts the target accepted and rejected."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    speculation: SpecReceipt = SpecReceipt()


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()
    speculation: SpecReceipt = SpecReceipt()  # the same receipt, where clients before #15 read it
    completion_tokens_details: CompletionTokensDetails | None = None


def make_usage(prompt_tokens: int, completion_tokens: int, receipt: SpecReceipt, cached_tokens: int = 0) -> Usage:
    details = CompletionTokensDetails(accepted_prediction_tokens=receipt.accepted_tokens,
                                      rejected_prediction_tokens=receipt.drafted_tokens - receipt.accepted_tokens,
                                      speculation=receipt)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens), speculation=receipt,
                 completion_tokens_details=details)


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """An emitted token's log-probability and the most likely alternatives, from the target's
    processed logits at temperature 1 in the forward that emitted it."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class TokensEmitted(Msg, frozen=True):
    request_id: str
    token_ids: tuple[int, ...]
    text: str
    index: int  # position of the first of token_ids in the completion
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, where the request asked for them


class Finished(Msg, frozen=True):
    request_id: str
    finish_reason: FinishReason
    usage: Usage
    stop: str | None = None  # the stop string that ended it, where one did


class Cancelled(Msg, frozen=True):
    request_id: str
    reason: str
    usage: Usage


class Failed(Msg, frozen=True):
    request_id: str
    error: str
    status: int = 500


StreamEvent = TokensEmitted | Finished | Cancelled | Failed

# --- every actor -> telemetry -------------------------------------------------------------------

class Describe(Msg, frozen=True):
    """Ask an actor for a plain-data account of its state (for /health)."""


class FailInFlight(Msg, frozen=True):
    """Another actor stopped: fail every request you hold with this error (scheduler); with
    request_ids, only those (the model owner lost their state)."""

    error: str
    status: int = 503
    request_ids: tuple[str, ...] = ()


class FailOpen(Msg, frozen=True):
    """Fail every request whose stream is still open (streamer; after FailInFlight)."""

    error: str
    status: int = 503


class Sample(Msg, frozen=True):
    """One measurement: a counter increment or an observed value."""

    name: str
    value: float
    kind: Literal["counter", "observe", "gauge"] = "counter"
    labels: tuple[tuple[str, str], ...] = ()


class Snapshot(Msg, frozen=True):
    format: Literal["dict", "prometheus"] = "dict"


class ActorFailure(Exception):
    """A request-reply that failed inside an actor, handed back to the sender."""

    def __init__(self, actor: str, message: str, status: int = 500):
        super().__init__(f"{actor}: {message}")
        self.actor, self.message, self.status = actor, message, status
