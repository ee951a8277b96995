"""Telemetry's account of recent traffic, for the dashboard: per-second step series (tokens and
seconds by step kind, batch width, the decider's state), gate switches, recent requests with their
receipts, and views of the registry (acceptance by position, latency distributions).

Part of the telemetry actor's state; pure (the times come in the records).
"""

from __future__ import annotations

from collections import deque

import msgspec

from runtime.decisions import StepTrace
from runtime.metrics import Metrics
from runtime.observe import RequestEnded

SERIES_SECONDS = 600  # the last ten minutes, one point per second that had steps
RECENT_REQUESTS = 50
DISTRIBUTIONS = {"ttft": "time_to_first_token_seconds", "itl": "inter_token_latency_seconds",
                 "e2e": "e2e_request_latency_seconds", "queue": "request_queue_time_seconds"}


class Traffic:
    def __init__(self):
        self.seconds: deque[dict] = deque(maxlen=SERIES_SECONDS)
        self.requests: deque[dict] = deque(maxlen=RECENT_REQUESTS)
        self.switches: deque[dict] = deque(maxlen=100)
        self.last: StepTrace | None = None
        self.steps = 0

    def note_step(self, trace: StepTrace) -> None:
        self.steps += 1
        self.last = trace
        second = int(trace.at)
        if not self.seconds or self.seconds[-1]["t"] != second:
            self.seconds.append({"t": second, "plain_tokens": 0, "plain_s": 0.0, "mtp_tokens": 0, "mtp_s": 0.0,
                                 "steps": 0, "width_max": 0})
        point = self.seconds[-1]
        point[f"{trace.ran}_tokens"] += trace.tokens
        point[f"{trace.ran}_s"] += trace.wall_s
        point["steps"] += 1
        point["width_max"] = max(point["width_max"], trace.width)
        decision = trace.decision
        point["decider"] = decision.decider
        if decision.gate is not None:
            state = decision.gate.state
            point.update(gate_mode=state["mode"], gate_serial_tok_s=state["serial"]["tok_s"],
                         gate_mtp_tok_s=state["mtp"]["tok_s"])
        if decision.decider == "controller":
            point["planner_depth"] = max(point.get("planner_depth", 0), max(decision.depths, default=0))

    def note_switch(self, to: str, at: float) -> None:
        self.switches.append({"t": at, "to": to})

    def note_request(self, ended: RequestEnded) -> None:
        row = {"request_id": ended.request_id, "outcome": ended.outcome, "detail": ended.detail, "at": ended.at}
        if ended.usage is not None:
            row.update(prompt_tokens=ended.usage.prompt_tokens, completion_tokens=ended.usage.completion_tokens,
                       receipt=msgspec.to_builtins(ended.usage.speculation))
        self.requests.append(row)

    def view(self, metrics: Metrics) -> dict:
        return {"steps": self.steps, "series": [_rates(p) for p in self.seconds], "switches": list(self.switches),
                "requests": list(reversed(self.requests)), "acceptance": acceptance(metrics),
                "distributions": {k: distribution(metrics, v) for k, v in DISTRIBUTIONS.items()},
                "last_decision": msgspec.to_builtins(self.last) if self.last else None}


def _rates(point: dict) -> dict:
    """tok/s of each kind while it ran (tokens over that kind's step time), and overall."""
    out = dict(point)
    for kind in ("plain", "mtp"):
        s = point[f"{kind}_s"]
        out[f"{kind}_tok_s"] = round(point[f"{kind}_tokens"] / s, 3) if s > 0 else None
    return out


def acceptance(metrics: Metrics) -> dict:
    """Drafts verified and accepted by position (0-based), summed over drafters."""
    def by_position(short: str) -> list[float]:
        counts: dict[int, float] = {}
        for labels, values in metrics.series(short):
            position = int(labels["position"])
            counts[position] = counts.get(position, 0.0) + values.get("_total", 0.0)
        return [counts.get(i, 0.0) for i in range(max(counts, default=-1) + 1)]

    def total(short: str) -> float:
        return sum(v.get("_total", 0.0) for _, v in metrics.series(short))

    drafted = by_position("spec_decode_num_draft_tokens_per_pos")
    accepted = by_position("spec_decode_num_accepted_tokens_per_pos")
    accepted += [0.0] * (len(drafted) - len(accepted))
    return {"num_drafts": total("spec_decode_num_drafts"), "draft_tokens": total("spec_decode_num_draft_tokens"),
            "accepted_tokens": total("spec_decode_num_accepted_tokens"), "drafted_by_position": drafted,
            "accepted_by_position": accepted,
            "rate_by_position": [round(a / d, 4) if d else None for a, d in zip(accepted, drafted)]}


def distribution(metrics: Metrics, short: str) -> dict:
    """A histogram as bucket bounds and per-bucket counts (not cumulative), with count and sum."""
    series = metrics.series(short)
    if not series:
        return {"bounds": [], "counts": [], "count": 0, "sum": 0.0}
    values = series[0][1]
    cumulative = sorted(((float(k[3:]), v) for k, v in values.items() if k.startswith("le=")))
    counts, previous = [], 0.0
    for _, c in cumulative:
        counts.append(c - previous)
        previous = c
    bounds = [b if b != float("inf") else None for b, _ in cumulative]  # None: the +Inf bucket
    return {"bounds": bounds, "counts": counts, "count": values.get("_count", 0.0),
            "sum": round(values.get("_sum", 0.0), 6)}
