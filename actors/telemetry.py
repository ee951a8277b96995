"""Telemetry: folds Samples from every actor into counters, summaries and gauges.

Receives Sample (tell) and Snapshot (ask: replies a plain dict for /health and dashboards).
Renders the Prometheus text format for /metrics.
"""

from __future__ import annotations

from typing import assert_never

from runtime.actor import Actor
from runtime.messages import Sample, Snapshot

Key = tuple[str, tuple[tuple[str, str], ...]]


class Telemetry(Actor):
    name = "telemetry"

    def __init__(self, prefix: str = "metrale"):
        super().__init__(inbox_size=8192)
        self.prefix = prefix
        self.counters: dict[Key, float] = {}
        self.gauges: dict[Key, float] = {}
        self.summaries: dict[Key, list[float]] = {}  # [count, sum, max]

    async def handle(self, msg: Sample | Snapshot):
        match msg:
            case Sample():
                self.record(msg)
            case Snapshot(format="prometheus"):
                return self.prometheus()
            case Snapshot():
                return self.snapshot()
            case _:
                assert_never(msg)

    def record(self, s: Sample) -> None:
        key = (s.name, s.labels)
        if s.kind == "counter":
            self.counters[key] = self.counters.get(key, 0.0) + s.value
        elif s.kind == "gauge":
            self.gauges[key] = s.value
        else:
            agg = self.summaries.setdefault(key, [0, 0.0, float("-inf")])
            agg[0] += 1
            agg[1] += s.value
            agg[2] = max(agg[2], s.value)

    def snapshot(self) -> dict:
        def label(key: Key) -> str:
            name, labels = key
            return name + ("{" + ",".join(f"{k}={v}" for k, v in labels) + "}" if labels else "")

        return {
            "counters": {label(k): v for k, v in self.counters.items()},
            "gauges": {label(k): v for k, v in self.gauges.items()},
            "summaries": {label(k): {"count": c, "sum": round(t, 6), "max": round(m, 6)}
                          for k, (c, t, m) in self.summaries.items()},
        }

    def prometheus(self) -> str:
        lines = []
        for (name, labels), value in sorted(self.counters.items()):
            lines.append(f"{self._name(name)}{self._labels(labels)} {value:g}")
        for (name, labels), value in sorted(self.gauges.items()):
            lines.append(f"{self._name(name)}{self._labels(labels)} {value:g}")
        for (name, labels), (count, total, _) in sorted(self.summaries.items()):
            lines.append(f"{self._name(name)}_count{self._labels(labels)} {count}")
            lines.append(f"{self._name(name)}_sum{self._labels(labels)} {total:.6f}")
        return "\n".join(lines) + "\n"

    def _name(self, name: str) -> str:
        return f"{self.prefix}_{name}"

    @staticmethod
    def _labels(labels) -> str:
        return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""
