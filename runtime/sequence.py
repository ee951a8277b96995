"""A request inside the scheduler: its status (with the transitions it may take) and its tokens."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from runtime.content_phase import PhaseTracker
from runtime.eligibility import ThinkProgress
from runtime.messages import FinishReason, SamplingParams, SpecReceipt, Usage, make_usage
from runtime.text import IncrementalText


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (Status.FINISHED, Status.CANCELLED, Status.FAILED)


_ENDINGS = {Status.FINISHED, Status.CANCELLED, Status.FAILED}
TRANSITIONS: dict[Status, set[Status]] = {
    Status.WAITING: {Status.PREFILLING} | _ENDINGS - {Status.FINISHED},
    Status.PREFILLING: {Status.DECODING} | _ENDINGS,
    Status.DECODING: _ENDINGS,
    Status.FINISHED: set(),
    Status.CANCELLED: set(),
    Status.FAILED: set(),
}


class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True)
class StepRecord:
    """One verify step of a recorded request: the verified drafts' confidences (top-1
    log-probabilities; empty for n-gram drafts, or where the scheduler passes none) and counts."""

    confidences: tuple[float, ...]
    drafted: int
    accepted: int


# Step recorders asked for by request id, before submitting, by code in this process (benchmarks,
# calibration); each goes to its Sequence when the scheduler creates it. Served requests never
# have one: recording is off unless asked for, and then costs one append per verify step.
_RECORDERS: dict[str, list[StepRecord]] = {}


def record_steps(request_id: str) -> list[StepRecord]:
    """A list that will receive one StepRecord per verify step of this request."""
    return _RECORDERS.setdefault(request_id, [])


def forget_steps(request_id: str) -> None:
    """Drop a recorder that no Sequence took (the request was never admitted)."""
    _RECORDERS.pop(request_id, None)


@dataclass
class SpecCounters:
    """Mutable tallies behind the SpecReceipt a request ends with."""

    drafted: list[int] = field(default_factory=list)  # by draft position
    accepted: list[int] = field(default_factory=list)
    verify_steps: int = 0
    plain_steps: int = 0
    verify_seconds: float = 0.0
    plain_seconds: float = 0.0
    forced: int = 0  # grammar-forced tokens verified as free drafts
    records: list[StepRecord] | None = None  # per verify step, only where asked (record_steps)

    def note_verify(self, drafted: int, accepted: int, seconds: float,
                    confidences: tuple[float, ...] = ()) -> None:
        """One verify step: positions 1..drafted were drafted, 1..accepted accepted."""
        if self.records is not None:
            self.records.append(StepRecord(tuple(confidences[:drafted]), drafted, accepted))
        width = max(drafted, len(self.drafted))
        self.drafted.extend([0] * (width - len(self.drafted)))
        self.accepted.extend([0] * (width - len(self.accepted)))
        for position in range(drafted):
            self.drafted[position] += 1
            self.accepted[position] += position < accepted
        self.verify_steps += 1
        self.verify_seconds += seconds

    def note_forced(self, tokens: int, seconds: float) -> None:
        """One verify step of the grammar's forced tokens: a forward, not a drafter's evidence."""
        self.forced += tokens
        self.verify_steps += 1
        self.verify_seconds += seconds

    def receipt(self) -> SpecReceipt:
        return SpecReceipt(
            drafted_tokens=sum(self.drafted), accepted_tokens=sum(self.accepted),
            drafted_by_position=tuple(self.drafted), accepted_by_position=tuple(self.accepted),
            verify_steps=self.verify_steps, plain_steps=self.plain_steps,
            verify_seconds=round(self.verify_seconds, 6), plain_seconds=round(self.plain_seconds, 6),
            forced_tokens=self.forced,
        )


@dataclass
class Sequence:
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    text: IncrementalText
    submitted_at: float
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    spec: SpecCounters = field(default_factory=SpecCounters)
    finish_reason: FinishReason | None = None
    first_token_at: float | None = None
    think: ThinkProgress = field(default_factory=ThinkProgress)
    cached_tokens: int = 0  # prompt tokens the prompt cache gave
    constraint: object = None  # structured output: a runtime.grammar.Constraint, else None
    content: PhaseTracker = field(default_factory=PhaseTracker)  # where its text stands (a tool call?)

    def __post_init__(self) -> None:
        if _RECORDERS:  # empty unless something in this process asked to record steps
            self.spec.records = _RECORDERS.pop(self.request_id, None)

    def move(self, to: Status) -> None:
        if to not in TRANSITIONS[self.status]:
            raise IllegalTransition(f"{self.request_id}: {self.status.value} -> {to.value}")
        self.status = to

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - len(self.output_ids)

    def accept(self, token_ids, eos_ids) -> tuple[list[int], str]:
        """Append emitted tokens up to the first ending; returns the kept ids and their text."""
        kept = []
        for token in token_ids:
            if token in eos_ids:
                self.finish_reason = "stop"
                break
            kept.append(token)
            self.output_ids.append(token)
            if self.remaining <= 0:
                self.finish_reason = "length"
                break
        if self.first_token_at is None and kept:
            self.first_token_at = time.monotonic()
        delta = self.text.add(kept)
        if self.text.stopped:
            self.finish_reason = "stop"
        elif self.finish_reason is not None:
            delta += self.text.flush()
        return kept, delta

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def usage(self) -> Usage:
        prompt, completion = len(self.prompt_ids), len(self.output_ids)
        return make_usage(prompt, completion, self.spec.receipt(), self.cached_tokens)

    def kept_tokens(self) -> tuple[int, ...]:
        """What the prompt cache may keep when it leaves: its prompt and output, unless it opted out
        or failed (a failed sequence's caches are not trusted)."""
        if not self.params.cache_prompt or self.status is Status.FAILED:
            return ()
        return self.prompt_ids + tuple(self.output_ids)
