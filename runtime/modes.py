"""Scheduler modes: which waiting requests start now, and which active ones step together.

Pure policy over the scheduler's containers; the scheduler does the work.
- serial: one request at a time on the plain serial path (with one step of lookahead).
- mtp_batch: continuous batching; requests join between steps up to max_active_requests and leave
  as soon as they end; a group of newcomers prefills in chunks between the running batch's steps
  (runtime/prefill_budget.py sizes them); the batch speculates when the gate says it pays (spec/plan.md caps it at
  mtp_max_seqs).
- hyper: serial's one request at a time, each run bound through the HyperAdmissionGate
  (runtime/hyper.py, spec/hyper.md): width 1 runs the serial closure itself; the tree width executor
  (actors/scheduler_tree.py) runs it too and widens its speculative steps with alternative drafts.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Protocol

from runtime.config import ConfigError, SchedulerConfig
from runtime.hyper import HyperAdmissionGate, HyperTicket
from runtime.sequence import Sequence, Status


class SchedulerMode(Protocol):
    name: str
    lookahead: bool
    batch_wait_s: float
    prefill_group: int
    chunked_prefill: bool  # a group prefills over several steps (PrefillChunk), not in one Prefill

    def admit(self, waiting: deque[Sequence], active: dict[str, Sequence]) -> list[Sequence]: ...

    def decode_batch(self, active: dict[str, Sequence]) -> list[Sequence]: ...

    def note_step(self, kind: str, width: int, rows_verified: int, accepted: int) -> None: ...

    def describe(self) -> dict: ...

    def note_admitted(self, seq: Sequence) -> None: ...

    def note_left(self, seq: Sequence) -> None: ...


def _decoding(active: dict[str, Sequence]) -> list[Sequence]:
    return [s for s in active.values() if s.status is Status.DECODING and not s.done]


class SerialMode:
    """One request at a time, first come first served, on the plain serial path."""

    name = "serial"
    lookahead = True
    batch_wait_s = 0.0
    prefill_group = 1
    chunked_prefill = False

    def __init__(self):
        self.steps: Counter[str] = Counter()

    def admit(self, waiting, active):
        return [waiting.popleft()] if waiting and not active else []

    def decode_batch(self, active):
        return _decoding(active)[:1]

    def note_step(self, kind, width, rows_verified, accepted):
        self.steps[kind] += 1

    def describe(self) -> dict:
        return {"serial": {"steps_by_kind": dict(self.steps)}, "hyper": {}}

    def note_admitted(self, seq) -> None:
        pass

    def note_left(self, seq) -> None:
        pass


class HyperMode(SerialMode):
    """Serial's order and steps; each request's ticket is taken on arrival and bound when it starts."""

    name = "hyper"

    def __init__(self, width_executor: str = "tree", max_width: int = 4):
        super().__init__()
        self.width_executor, self.max_width = width_executor, max_width  # the scheduler installs it
        self.gate = HyperAdmissionGate()
        self.tickets: dict[str, HyperTicket] = {}

    def note_admitted(self, seq) -> None:
        self.tickets[seq.request_id] = self.gate.admit(request_id=seq.request_id, prompt_tokens=len(seq.prompt_ids))

    def note_left(self, seq) -> None:
        ticket = self.tickets.pop(seq.request_id, None)
        if ticket is not None:
            self.gate.release(ticket)  # counted abandoned if it never started; a run settles its own

    def bind(self, seq, singleton):
        mode = "ar" if seq.params.disable_mtp else "mtp"
        return self.gate.bind(self.tickets[seq.request_id], singleton, generation_mode=mode)

    def describe(self) -> dict:
        executor = self.gate.executor
        tree = executor.snapshot() if hasattr(executor, "snapshot") else None
        return {"hyper": {**self.gate.snapshot(), "steps_by_kind": dict(self.steps), "tree": tree}}


class MtpBatchMode:
    """Continuous batching: every decoding request steps in one batch; new ones join between steps."""

    name = "mtp_batch"
    lookahead = True  # plain batch steps start the next one before reading their tokens
    chunked_prefill = True

    def __init__(self, max_active: int, batch_wait_ms: float, prefill_group: int = 8):
        self.max_active, self.batch_wait_s = max_active, batch_wait_ms / 1000.0
        self.prefill_group = prefill_group  # new requests prefill together, up to this many per forward
        self.width_histogram: Counter[int] = Counter()
        self.steps: Counter[str] = Counter()
        self.rows_verified = self.accepted = 0

    def admit(self, waiting, active):
        # One prefill group per step: a burst of arrivals interleaves its prefills with decode
        # steps of the running batch instead of stalling it for every group in turn.
        room = min(self.max_active - len(active), self.prefill_group)
        return [waiting.popleft() for _ in range(min(room, len(waiting)))]

    def decode_batch(self, active):
        return _decoding(active)

    def note_step(self, kind, width, rows_verified, accepted):
        self.width_histogram[width] += 1
        self.steps[kind] += 1
        self.rows_verified += rows_verified
        self.accepted += accepted

    def note_admitted(self, seq) -> None:
        pass

    def note_left(self, seq) -> None:
        pass

    def describe(self) -> dict:
        acceptance = self.accepted / self.rows_verified if self.rows_verified else None
        return {"mtp_batch": {"batch_width_histogram": dict(sorted(self.width_histogram.items())),
                              "steps_by_kind": dict(self.steps), "rows_verified": self.rows_verified,
                              "accepted": self.accepted, "acceptance": acceptance,
                              "max_active_requests": self.max_active}}


def make_mode(config: SchedulerConfig) -> SchedulerMode:
    if config.mode == "serial":
        return SerialMode()
    if config.mode == "mtp_batch":
        return MtpBatchMode(config.max_active_requests, config.batch_wait_ms, config.prefill_group)
    if config.mode == "hyper":
        return HyperMode(config.hyper_width_executor, config.hyper_max_width)
    raise ConfigError(f"--scheduler-mode {config.mode} is not a scheduler mode (serial, mtp_batch, hyper)")
