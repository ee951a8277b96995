"""The model owner's protocol: what the scheduler, drafter and verifier ask of the model owner
(prefill, decode, drafts, verification, draft trees, cost-cell timing), and what a distributed rank 0
sends the other ranks. Commands are imperative, events past tense; all frozen.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from runtime.messages import Msg, SamplingParams, TokenLogprob

# --- scheduler <-> model owner ----------------------------------------------------------------

class Prefill(Msg, frozen=True):
    seq_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    lookahead: bool = True


class PrefillChunk(Msg, frozen=True):
    """mtp_batch: start prefilling several sequences together (items), or with no items go on with
    the group in flight; at most `budget` padded tokens (rows x positions) now, 0: the rest.
    Replies PrefillProgress."""

    items: tuple[Prefill, ...]
    budget: int


class Decode(Msg, frozen=True):
    """One plain step for each sequence; lookahead lets the owner start the next step early."""

    seq_ids: tuple[str, ...]
    lookahead: tuple[bool, ...]


class StartAhead(Msg, frozen=True):
    """After a speculative step whose next step will likely be plain: start that plain step now, so
    it computes while the scheduler streams this step's tokens (a plain step's own lookahead)."""

    seq_ids: tuple[str, ...]


class Release(Msg, frozen=True):
    """Drop a sequence; with its tokens (prompt and output), the prompt cache may keep its KV."""

    seq_id: str
    tokens: tuple[int, ...] = ()


class Prefilled(Msg, frozen=True):
    seq_id: str
    token: int
    seconds: float
    cached_tokens: int = 0  # prompt tokens the prompt cache gave (not computed)
    logprobs: tuple[TokenLogprob, ...] = ()


class PrefillProgress(Msg, frozen=True):
    """One Prefilled per sequence once the group is done (empty before); the padded tokens run."""

    prefilled: tuple[Prefilled, ...]
    tokens: int
    seconds: float


class Decoded(Msg, frozen=True):
    tokens: tuple[int, ...]
    seconds: float
    logprobs: tuple[tuple[TokenLogprob, ...], ...] = ()  # per sequence, where any asked for them
    traces: int = 0  # compiled graphs the owner has traced so far (a step that moved it paid for tracing)


class Quantization(msgspec.Struct, frozen=True, kw_only=True):
    bits: int | None
    group_size: int | None
    mode: str = "affine"


class ModelInfo(Msg, frozen=True):
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

class Draft(Msg, frozen=True):
    """Propose up to k drafts for a sequence; history is its prompt and output so far."""

    seq_id: str
    history: tuple[int, ...]
    k: int


class Drafted(Msg, frozen=True):
    tokens: tuple[int, ...]
    confidences: tuple[float, ...]  # top-1 log-probabilities; empty for n-gram lookup
    has_probs: bool  # the drafter sampled from a distribution q that verification must use
    seconds: float
    forced: bool = False  # the grammar's forced tokens, not a drafter's guess (kept out of its statistics)
    caught_up: int = 0  # tokens the drafter first caught up on (fed by plain steps or a prefill since its last draft)


class DraftMany(Msg, frozen=True):
    """Drafts for several sequences of a batch step in one ask; replies one Drafted each, in order."""

    items: tuple[Draft, ...]


class Propose(Msg, frozen=True):
    seq_id: str
    k: int


class ProposeMany(Msg, frozen=True):
    """Model-side drafts for several sequences in one owner job; replies one Drafted each."""

    items: tuple[Propose, ...]


class VerifyDrafts(Msg, frozen=True):
    seq_id: str
    drafts: tuple[int, ...]
    use_draft_probs: bool


class Verified(Msg, frozen=True):
    accepted: int
    emitted: tuple[int, ...]
    seconds: float
    logprobs: tuple[TokenLogprob, ...] = ()
    traces: int = 0  # as Decoded's


class VerifyBatch(Msg, frozen=True):
    """Verify many sequences in one target forward; rows without drafts take a plain step."""

    rows: tuple[VerifyDrafts, ...]


class VerifiedBatch(Msg, frozen=True):
    results: tuple[Verified, ...]
    seconds: float
    traces: int = 0  # as Decoded's


class Rollback(Msg, frozen=True):
    """Trim every cache of a sequence to its accepted prefix."""

    seq_id: str
    drafted: int
    accepted: int
    emitted: tuple[int, ...]


# --- hyper mode's width executor -> model owner: draft trees (kernels/tree.py) -----------------------

class CanBranch(Msg, frozen=True):
    """Ask the owner whether its model and drafter can verify draft trees; replies Branching."""


class Branching(Msg, frozen=True):
    ok: bool
    reason: str = ""  # why not, where not


class ProposeTree(Msg, frozen=True):
    """The model-side drafter's spine of k drafts and, at each depth, its next `top` candidates."""

    seq_id: str
    k: int
    top: int


class DraftedTree(Msg, frozen=True):
    tokens: tuple[int, ...]  # the spine: the chain Propose would have drafted (greedy, at any temperature)
    confidences: tuple[float, ...]
    alternatives: tuple[tuple[tuple[int, float], ...], ...]  # per depth: (token, probability), best first
    seconds: float
    caught_up: int = 0  # as Drafted's


class VerifyTree(Msg, frozen=True):
    """One target forward over a draft tree; the owner walks it and keeps the accepted path."""

    seq_id: str
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    leaves: tuple[int, ...]
    layout: Literal["mask", "rows"] = "mask"


class TreeVerified(Msg, frozen=True):
    accepted: int
    emitted: tuple[int, ...]
    branch: int  # the branch whose path was kept (0: the spine)
    branch_accepted: tuple[int, ...]  # what each branch alone would have had accepted
    seconds: float


class TimeCell(Msg, frozen=True):
    """Self-calibration: time one call of a cost cell's probe (kernels/cell_timer.py)."""

    kind: str  # "verify" | "draft"
    width: int
    depth: int


class CellTimed(Msg, frozen=True):
    ms: float
    joules: float


# --- the model owner's thread, and rank 0 -> the other ranks of a distributed group --------------

# What the owner thread runs; a distributed rank 0 broadcasts each before running it (actors/group_owner.py).
OwnerCommand = (Prefill | PrefillChunk | Decode | StartAhead | Release | Propose | ProposeMany | VerifyDrafts
                | VerifyBatch | Rollback | TimeCell | CanBranch | ProposeTree | VerifyTree)


class Heartbeat(Msg, frozen=True):
    """Rank 0 is alive and idle; the other ranks answer it as they answer any command."""


class StopFollowers(Msg, frozen=True):
    """Rank 0 is shutting down: the other ranks end their loops and exit."""


GroupCommand = OwnerCommand | Heartbeat | StopFollowers
