"""Telemetry: folds what every actor measures into the server's Prometheus registry, keeps the
decision ring and the dashboard's recent traffic.

Receives Sample (tell, from every actor), StepTrace (tell, the scheduler's decision and measurement
of each step), RequestEnded (tell, the streamer), WriteTraces (ask: append decisions to a file),
Snapshot (ask: the registry as a dict for /health, or Prometheus text for /metrics), ExportTraces
and DescribeTraffic (asks, for /v1/traces and the dashboard). Sends nothing.
"""

from __future__ import annotations

import time
from collections import deque
from typing import assert_never

from runtime.actor import Actor
from runtime.decisions import StepTrace, encode_line
from runtime.messages import Sample, Snapshot
from runtime.metrics import Metrics
from runtime.observe import DescribeTraffic, ExportTraces, RequestEnded, WriteTraces
from runtime.traffic import Traffic

TRACE_RING = 20_000  # decisions kept (~20 minutes of steps at 60 ms; ~16 MB as JSON lines)
DECIDERS = ("controller", "gate", "force", "off")


class Telemetry(Actor):
    name = "telemetry"

    def __init__(self, trace_ring: int = TRACE_RING):
        super().__init__()  # its inbox bound: Config.actors
        self.metrics = Metrics()
        self.traces: deque[bytes] = deque(maxlen=trace_ring)  # JSONL lines: a third of the structs' memory
        self.traffic = Traffic()
        self.trace_file = None
        self.refused: set[str] = set()  # samples that did not fit their family, logged once each
        self.decider: str | None = None  # the latest step's, so its gauges are set only when it changes

    async def handle(self, msg):
        match msg:
            case Sample():
                self.record(msg)
            case StepTrace():
                self.note_step(msg)
            case RequestEnded():
                self.traffic.note_request(msg)
            case Snapshot(format="prometheus"):
                return self.metrics.exposition()
            case Snapshot():
                return self.metrics.snapshot()
            case ExportTraces():
                return tuple(self.traces)
            case DescribeTraffic():
                return self.traffic.view(self.metrics)
            case WriteTraces():
                self.open_trace_file(msg)
            case _:
                assert_never(msg)

    def record(self, s: Sample) -> None:
        try:
            self.metrics.record(s.name, s.kind, s.value, s.labels)
        except ValueError as e:  # labels other than the family's: a sender's bug, not a reason to stop
            if s.name not in self.refused:
                self.refused.add(s.name)
                self.log.warning("sample_refused", sample=s.name, labels=s.labels, error=str(e))
            return
        if s.name == "gate_switches_total":
            self.traffic.note_switch(dict(s.labels).get("to", ""), time.time())

    def note_step(self, trace: StepTrace) -> None:
        line = encode_line(trace)
        self.traces.append(line)
        if self.trace_file is not None:
            self.trace_file.write(line)
            self.trace_file.flush()
        self.traffic.note_step(trace)
        m = self.metrics
        for name, value in (("batch_width", trace.width), ("num_requests_running", trace.active),
                            ("num_requests_waiting", trace.waiting)):
            m.record(name, "gauge", float(value))
        if trace.decision.decider != self.decider:
            self.decider = trace.decision.decider
            for decider in DECIDERS:
                m.record("speculation_decider", "gauge", float(decider == self.decider), (("decider", decider),))
        if trace.drafter != "none" and (any(trace.drafted) or not self.traffic.steps > 1):
            self.count_drafts(trace)  # plain steps add nothing, but the first step makes the series exist

    def count_drafts(self, trace: StepTrace) -> None:
        """The spec_decode counters: one draft per row that verified drafts, tokens by position."""
        m, drafter = self.metrics, (("drafter", trace.drafter),)
        rows = [(d, a) for d, a in zip(trace.drafted, trace.accepted) if d]
        m.record("spec_decode_num_drafts", "counter", float(len(rows)), drafter)
        m.record("spec_decode_num_draft_tokens", "counter", float(sum(d for d, _ in rows)), drafter)
        m.record("spec_decode_num_accepted_tokens", "counter", float(sum(a for _, a in rows)), drafter)
        for position in range(max((d for d, _ in rows), default=0)):
            label = drafter + (("position", str(position)),)
            m.record("spec_decode_num_draft_tokens_per_pos", "counter",
                     float(sum(1 for d, _ in rows if d > position)), label)
            m.record("spec_decode_num_accepted_tokens_per_pos", "counter",
                     float(sum(1 for _, a in rows if a > position)), label)

    def open_trace_file(self, msg: WriteTraces) -> None:
        if self.trace_file is not None:
            self.trace_file.close()
        self.trace_file = open(msg.path, "wb")  # one run per file: a replay starts from its header
        self.trace_file.write(encode_line(msg.header))
        self.trace_file.flush()
        self.log.info("trace_file_opened", path=msg.path)

    async def teardown(self) -> None:
        if self.trace_file is not None:
            self.trace_file.close()
            self.trace_file = None
