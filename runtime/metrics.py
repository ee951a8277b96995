"""The server's Prometheus registry: every metric declared once, with its help, labels and buckets.

Samples arrive by their short name (`requests_total`, `sched_phase_seconds`); this module maps each
to its exposed family. Names that users' dashboards already know keep the convention of the
reference servers (`metrale:spec_decode_num_drafts`, `metrale:time_to_first_token_seconds`); the
rest are `metrale_<short name>`. A sample nobody declared still gets a family, created on first
sight with its sender's labels, so a new actor's samples show without touching this file.

Owned by the telemetry actor (its state); nothing else records into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# One series per value, not a `_created` twin for each: dashboards never read those.
prometheus_client.disable_created_metrics()
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TOKEN_GAP = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
STEP = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Declared:
    name: str  # as exposed
    kind: str  # "counter" | "gauge" | "observe" (a histogram)
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = STEP


def _spec(short: str, help: str, labels=("drafter",)) -> tuple[str, Declared]:
    return short, Declared(f"metrale:{short}", "counter", help, labels)


def _ours(short: str, kind: str, help: str, labels=(), buckets=STEP) -> tuple[str, Declared]:
    return short, Declared(f"metrale_{short}", kind, help, labels, buckets)


def _latency(short: str, help: str, buckets=LATENCY) -> tuple[str, Declared]:
    return short, Declared(f"metrale:{short}", "observe", help, (), buckets)


DECLARED: dict[str, Declared] = dict([
    _spec("spec_decode_num_drafts", "Draft sequences verified (one per sequence per speculative step)"),
    _spec("spec_decode_num_draft_tokens", "Draft tokens verified"),
    _spec("spec_decode_num_accepted_tokens", "Draft tokens accepted"),
    _spec("spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at each draft position (0-based)",
          ("drafter", "position")),
    _spec("spec_decode_num_draft_tokens_per_pos", "Draft tokens verified at each draft position (0-based): "
          "with per-step depths, the denominator of acceptance by position", ("drafter", "position")),
    _latency("time_to_first_token_seconds", "From submission to the first generated token"),
    _latency("inter_token_latency_seconds", "Between consecutive emissions of one request (a speculative "
             "step emits several tokens at once)", TOKEN_GAP),
    _latency("e2e_request_latency_seconds", "From submission to the end of a finished request"),
    _latency("request_queue_time_seconds", "From submission to the start of its prefill"),
    ("num_requests_running", Declared("metrale:num_requests_running", "gauge", "Requests prefilling or decoding")),
    ("num_requests_waiting", Declared("metrale:num_requests_waiting", "gauge", "Requests waiting to start")),
    _ours("sched_phase_seconds", "observe", "Wall time of one scheduler step, by kind", ("phase",)),
    _ours("prefill_seconds", "observe", "Wall time of one prefill (or a prefilled group)", buckets=LATENCY),
    _ours("batch_width", "gauge", "Sequences in the latest step"),
    _ours("speculation_decider", "gauge", "1 for what decides speculation now (gate, controller, force, off)",
          ("decider",)),
    _ours("gate_mode_mtp", "gauge", "The MTP gate's mode: 1 speculative, 0 plain"),
    _ours("gate_serial_tok_s", "gauge", "The gate's estimate of plain decode tok/s"),
    _ours("gate_mtp_tok_s", "gauge", "The gate's estimate of speculative tok/s"),
    _ours("gate_serial_stale", "gauge", "1 while the plain estimate is stale"),
    _ours("gate_mtp_stale", "gauge", "1 while the speculative estimate is stale"),
    _ours("gate_width_bucket", "gauge", "The batch-width bucket the gate measures"),
    _ours("planner_depth", "gauge", "The deepest draft the controller chose at the latest step"),
    _ours("exploration_spent_ms", "gauge", "What exploring steps lost against plain decode, all told (ms)"),
    _ours("cost_model_observations", "gauge", "Served steps the online cost model has learned from"),
    _ours("requests_total", "counter", "Requests ended, by outcome", ("outcome",)),
    _ours("rejected_total", "counter", "Requests refused at admission, by reason", ("reason",)),
    _ours("drafted_tokens_total", "counter", "Tokens the drafter proposed (before the planner keeps its share)",
          ("drafter",)),
    _ours("accepted_tokens_total", "counter", "Draft tokens the verifier accepted"),
    _ours("gate_switches_total", "counter", "Switches of the gate's mode, by the mode switched to", ("to",)),
    _ours("prompt_cache_queries", "counter", "Requests that looked up the prompt cache"),
    _ours("prompt_cache_hits", "counter", "Lookups that reused at least one cached prompt token"),
    _ours("prompt_cache_hit_tokens", "counter", "Prompt tokens whose KV came from the prompt cache"),
    _ours("prompt_cache_query_tokens", "counter", "Prompt tokens of the requests that looked up the prompt cache"),
    _ours("prompt_cache_evictions", "counter", "Prompt-cache entries dropped to stay within its bounds"),
    _ours("prompt_cache_entries", "gauge", "Entries in the prompt cache"),
    _ours("prompt_cache_bytes", "gauge", "Bytes the prompt cache's entries hold (KV and drafter state)"),
])


class Metrics:
    """A registry of the server's own, and a plain-dict view of it for /health."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        self.families: dict[str, tuple[Declared, object]] = {}
        self.maxima: dict[tuple, float] = {}  # (short, labels) -> largest observation, for /health
        self.children: dict[tuple, tuple[str, object]] = {}  # (short, labels) -> (kind, series): one lookup a sample

    def record(self, short: str, kind: str, value: float, labels: tuple[tuple[str, str], ...] = ()) -> None:
        key = (short, labels)
        found = self.children.get(key)
        if found is None:
            declared, metric = self._family(short, kind, tuple(k for k, _ in labels))
            found = self.children[key] = declared.kind, metric.labels(**dict(labels)) if labels else metric
        kind, series = found
        if kind == "counter":
            series.inc(value)
        elif kind == "gauge":
            series.set(value)
        else:
            series.observe(value)
            self.maxima[key] = max(self.maxima.get(key, value), value)

    def _family(self, short: str, kind: str, label_names: tuple[str, ...]):
        if short not in self.families:
            declared = DECLARED.get(short) or Declared(f"metrale_{short}", kind, f"{short} (as its sender names it)",
                                                       label_names)
            self.families[short] = declared, _make(declared, self.registry)
        return self.families[short]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def series(self, short: str) -> list[tuple[dict[str, str], dict[str, float]]]:
        """One family's series: (labels, {suffix: value}); histogram buckets as `le=<bound>`."""
        if short not in self.families:
            return []
        declared, metric = self.families[short]
        out: dict[tuple, dict[str, float]] = {}
        for family in metric.collect():
            for s in family.samples:
                labels = {k: v for k, v in s.labels.items() if k != "le"}
                suffix = s.name[len(family.name):] or "value"
                if "le" in s.labels:
                    suffix = f"le={s.labels['le']}"
                out.setdefault(tuple(labels.items()), {})[suffix] = s.value
        return [(dict(k), v) for k, v in out.items()]

    def snapshot(self) -> dict:
        """{counters, gauges, summaries} keyed `short{k=v}`, as /health has always shown them."""
        view: dict[str, dict] = {"counters": {}, "gauges": {}, "summaries": {}}
        for short, (declared, _) in self.families.items():
            for labels, values in self.series(short):
                key = short + ("{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}" if labels else "")
                if declared.kind == "counter":
                    view["counters"][key] = values.get("_total", 0.0)
                elif declared.kind == "gauge":
                    view["gauges"][key] = values.get("value", 0.0)
                else:
                    peak = self.maxima.get((short, tuple(labels.items())), 0.0)
                    view["summaries"][key] = {"count": int(values.get("_count", 0)),
                                              "sum": round(values.get("_sum", 0.0), 6), "max": round(peak, 6)}
        return view


def _make(declared: Declared, registry: CollectorRegistry):
    common = {"name": declared.name, "documentation": declared.help, "labelnames": declared.labels,
              "registry": registry}
    if declared.kind == "counter":
        return Counter(**common)
    if declared.kind == "gauge":
        return Gauge(**common)
    return Histogram(**common, buckets=declared.buckets)
