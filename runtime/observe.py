"""Messages to the telemetry actor beyond Sample and Snapshot (runtime/messages.py).

StepTrace (runtime/decisions.py) comes from the scheduler once per step; RequestEnded from the
streamer once per request; the asks come from the server's routes.
"""

from __future__ import annotations

import msgspec

from runtime.decisions import TraceHeader
from runtime.messages import Usage


class _Msg(msgspec.Struct, frozen=True, tag=True, kw_only=True):
    pass


class RequestEnded(_Msg, frozen=True):
    """A request's terminal event, with its speculation receipt where it has one."""

    request_id: str
    outcome: str  # "finished" | "cancelled" | "failed"
    detail: str  # finish reason, cancel reason or error
    usage: Usage | None
    at: float  # wall clock


class ExportTraces(_Msg, frozen=True):
    """Ask: the decision ring, oldest first (a tuple of JSONL lines, each one StepTrace)."""


class DescribeTraffic(_Msg, frozen=True):
    """Ask: telemetry's part of the dashboard (series, recent requests, distributions)."""


class WriteTraces(_Msg, frozen=True):
    """Append every decision from now on to path as JSONL, after this header (--trace-file)."""

    path: str
    header: TraceHeader
