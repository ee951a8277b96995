"""Scheduler modes: which waiting requests start now, and which active ones step together.

Pure policy over the scheduler's containers; the scheduler does the work.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from runtime.config import ConfigError, SchedulerConfig
from runtime.sequence import Sequence, Status


class SchedulerMode(Protocol):
    name: str

    def admit(self, waiting: deque[Sequence], active: dict[str, Sequence]) -> list[Sequence]: ...

    def decode_batch(self, active: dict[str, Sequence]) -> list[Sequence]: ...


class SerialMode:
    """One request at a time, first come first served, on the plain serial path."""

    name = "serial"

    def admit(self, waiting, active):
        return [waiting.popleft()] if waiting and not active else []

    def decode_batch(self, active):
        return [s for s in active.values() if s.status is Status.DECODING and not s.done][:1]


def make_mode(config: SchedulerConfig) -> SchedulerMode:
    if config.mode == "serial":
        return SerialMode()
    raise ConfigError(f"--scheduler-mode {config.mode} is not available yet (serial is)")
