"""Typed messages between actors. Commands are imperative, events past tense; all frozen.

msgspec does not check types at construction: wire input is decoded in runtime/protocol.py.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import msgspec

FinishReason = Literal["stop", "length", "cancelled", "error", "tool_calls"]  # tool_calls: set at the edge


class _Msg(msgspec.Struct, frozen=True, tag=True, kw_only=True):
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

class Submit(_Msg, frozen=True):
    request_id: str
    params: SamplingParams
    messages: tuple[ChatMessage, ...] | None = None  # chat completions
    prompt: str | None = None  # text completions
    submitted_at: float = 0.0
    tools: tuple[dict, ...] = ()  # rendered through the chat template (runtime/tools.py)


class Admitted(_Msg, frozen=True):
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    submitted_at: float


class Cancel(_Msg, frozen=True):
    request_id: str
    reason: str = "client"


# --- scheduler -> streamer -> client ---------------------------------------------------------

class Subscribe(_Msg, frozen=True):
    """Route a request's events to queue (the client's, in-process only: never encoded)."""

    request_id: str
    queue: asyncio.Queue


class Unsubscribe(_Msg, frozen=True):
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


class TokensEmitted(_Msg, frozen=True):
    request_id: str
    token_ids: tuple[int, ...]
    text: str
    index: int  # position of the first of token_ids in the completion
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, where the request asked for them


class Finished(_Msg, frozen=True):
    request_id: str
    finish_reason: FinishReason
    usage: Usage
    stop: str | None = None  # the stop string that ended it, where one did


class Cancelled(_Msg, frozen=True):
    request_id: str
    reason: str
    usage: Usage


class Failed(_Msg, frozen=True):
    request_id: str
    error: str
    status: int = 500


StreamEvent = TokensEmitted | Finished | Cancelled | Failed

# --- scheduler <-> model owner ----------------------------------------------------------------

class Prefill(_Msg, frozen=True):
    seq_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    lookahead: bool = True


class PrefillChunk(_Msg, frozen=True):
    """mtp_batch: start prefilling several sequences together (items), or with no items go on with
    the group in flight; at most `budget` padded tokens (rows x positions) now, 0: the rest.
    Replies PrefillProgress."""

    items: tuple[Prefill, ...]
    budget: int


class Decode(_Msg, frozen=True):
    """One plain step for each sequence; lookahead lets the owner start the next step early."""

    seq_ids: tuple[str, ...]
    lookahead: tuple[bool, ...]


class StartAhead(_Msg, frozen=True):
    """After a speculative step whose next step will likely be plain: start that plain step now, so
    it computes while the scheduler streams this step's tokens (a plain step's own lookahead)."""

    seq_ids: tuple[str, ...]


class Release(_Msg, frozen=True):
    """Drop a sequence; with its tokens (prompt and output), the prompt cache may keep its KV."""

    seq_id: str
    tokens: tuple[int, ...] = ()


class Prefilled(_Msg, frozen=True):
    seq_id: str
    token: int
    seconds: float
    cached_tokens: int = 0  # prompt tokens the prompt cache gave (not computed)
    logprobs: tuple[TokenLogprob, ...] = ()


class PrefillProgress(_Msg, frozen=True):
    """One Prefilled per sequence once the group is done (empty before); the padded tokens run."""

    prefilled: tuple[Prefilled, ...]
    tokens: int
    seconds: float


class Decoded(_Msg, frozen=True):
    tokens: tuple[int, ...]
    seconds: float
    logprobs: tuple[tuple[TokenLogprob, ...], ...] = ()  # per sequence, where any asked for them


class Quantization(msgspec.Struct, frozen=True, kw_only=True):
    bits: int | None
    group_size: int | None
    mode: str = "affine"


class ModelInfo(_Msg, frozen=True):
    model_id: str
    path: str
    context_length: int
    vocab_size: int
    blas: str
    dtype: str  # "float32", or e.g. "4-bit (group 64), float32 activations"
    quantization: Quantization | None = None
    drafter: str = "none"  # the drafter actually in use ("auto" resolved)
    matmul: str = "stock"  # few-row products: "rows kernel on for 4-12 rows", or "stock ..." (kernels/rows_matmul.py)

    @property
    def compute(self) -> str:
        """What prices a step, for the cost tables: the BLAS and the products' kernel."""
        return f"{self.blas} | {self.matmul}"


# --- scheduler -> drafter / verifier -> model owner --------------------------------------------

class Draft(_Msg, frozen=True):
    """Propose up to k drafts for a sequence; history is its prompt and output so far."""

    seq_id: str
    history: tuple[int, ...]
    k: int


class Drafted(_Msg, frozen=True):
    tokens: tuple[int, ...]
    confidences: tuple[float, ...]  # top-1 log-probabilities; empty for n-gram lookup
    has_probs: bool  # the drafter sampled from a distribution q that verification must use
    seconds: float
    forced: bool = False  # the grammar's forced tokens, not a drafter's guess (kept out of its statistics)
    caught_up: int = 0  # tokens the drafter first caught up on (fed by plain steps or a prefill since its last draft)


class DraftMany(_Msg, frozen=True):
    """Drafts for several sequences of a batch step in one ask; replies one Drafted each, in order."""

    items: tuple[Draft, ...]


class Propose(_Msg, frozen=True):
    seq_id: str
    k: int


class ProposeMany(_Msg, frozen=True):
    """Model-side drafts for several sequences in one owner job; replies one Drafted each."""

    items: tuple[Propose, ...]


class VerifyDrafts(_Msg, frozen=True):
    seq_id: str
    drafts: tuple[int, ...]
    use_draft_probs: bool


class Verified(_Msg, frozen=True):
    accepted: int
    emitted: tuple[int, ...]
    seconds: float
    logprobs: tuple[TokenLogprob, ...] = ()


class VerifyBatch(_Msg, frozen=True):
    """Verify many sequences in one target forward; rows without drafts take a plain step."""

    rows: tuple[VerifyDrafts, ...]


class VerifiedBatch(_Msg, frozen=True):
    results: tuple[Verified, ...]
    seconds: float


class Rollback(_Msg, frozen=True):
    """Trim every cache of a sequence to its accepted prefix."""

    seq_id: str
    drafted: int
    accepted: int
    emitted: tuple[int, ...]


# --- hyper mode's width executor -> model owner: draft trees (kernels/tree.py) -----------------------

class CanBranch(_Msg, frozen=True):
    """Ask the owner whether its model and drafter can verify draft trees; replies Branching."""


class Branching(_Msg, frozen=True):
    ok: bool
    reason: str = ""  # why not, where not


class ProposeTree(_Msg, frozen=True):
    """The model-side drafter's spine of k drafts and, at each depth, its next `top` candidates."""

    seq_id: str
    k: int
    top: int


class DraftedTree(_Msg, frozen=True):
    tokens: tuple[int, ...]  # the spine: the chain Propose would have drafted (greedy, at any temperature)
    confidences: tuple[float, ...]
    alternatives: tuple[tuple[tuple[int, float], ...], ...]  # per depth: (token, probability), best first
    seconds: float
    caught_up: int = 0  # as Drafted's


class VerifyTree(_Msg, frozen=True):
    """One target forward over a draft tree; the owner walks it and keeps the accepted path."""

    seq_id: str
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    leaves: tuple[int, ...]
    layout: Literal["mask", "rows"] = "mask"


class TreeVerified(_Msg, frozen=True):
    accepted: int
    emitted: tuple[int, ...]
    branch: int  # the branch whose path was kept (0: the spine)
    branch_accepted: tuple[int, ...]  # what each branch alone would have had accepted
    seconds: float


# --- every actor -> telemetry -------------------------------------------------------------------

class Describe(_Msg, frozen=True):
    """Ask an actor for a plain-data account of its state (for /health)."""


class FailInFlight(_Msg, frozen=True):
    """Another actor stopped: fail every request you hold with this error (scheduler); with
    request_ids, only those (the model owner lost their state)."""

    error: str
    status: int = 503
    request_ids: tuple[str, ...] = ()


class FailOpen(_Msg, frozen=True):
    """Fail every request whose stream is still open (streamer; after FailInFlight)."""

    error: str
    status: int = 503


class TimeCell(_Msg, frozen=True):
    """Self-calibration: time one call of a cost cell's probe (kernels/cell_timer.py)."""

    kind: str  # "verify" | "draft"
    width: int
    depth: int


class CellTimed(_Msg, frozen=True):
    ms: float
    joules: float


# --- the model owner's thread, and rank 0 -> the other ranks of a distributed group --------------

# What the owner thread runs; a distributed rank 0 broadcasts each before running it (actors/group_owner.py).
OwnerCommand = (Prefill | PrefillChunk | Decode | StartAhead | Release | Propose | ProposeMany | VerifyDrafts
                | VerifyBatch | Rollback | TimeCell | CanBranch | ProposeTree | VerifyTree)


class Heartbeat(_Msg, frozen=True):
    """Rank 0 is alive and idle; the other ranks answer it as they answer any command."""


class StopFollowers(_Msg, frozen=True):
    """Rank 0 is shutting down: the other ranks end their loops and exit."""


GroupCommand = OwnerCommand | Heartbeat | StopFollowers


class Sample(_Msg, frozen=True):
    """One measurement: a counter increment or an observed value."""

    name: str
    value: float
    kind: Literal["counter", "observe", "gauge"] = "counter"
    labels: tuple[tuple[str, str], ...] = ()


class Snapshot(_Msg, frozen=True):
    format: Literal["dict", "prometheus"] = "dict"


class ActorFailure(Exception):
    """A request-reply that failed inside an actor, handed back to the sender."""

    def __init__(self, actor: str, message: str, status: int = 500):
        super().__init__(f"{actor}: {message}")
        self.actor, self.message, self.status = actor, message, status
