"""One cost cell timed on the model owner's thread, for the self-calibration of a fresh server.

The same probes as `metrale calibrate` (kernels/calibrate.py): verify(n, K) is one target forward of
[n, K+1] tokens over a batch cache of n identical contexts, trimmed back after each call; draft(n, K)
is the drafter's work for n sequences at depth K. Probes are built once per width and kept.
"""

from __future__ import annotations

import time

from kernels.calibrate import MtpDraftProbe, VerifyProbe, ngram_draft

CONTEXT_TOKENS = 128  # cost depends on shapes: any ids in the vocabulary make a realistic context


class CellTimer:
    def __init__(self, engine, drafter_kind: str, max_k: int, meter, vocab_size: int):
        self.engine, self.drafter_kind, self.max_k, self.meter = engine, drafter_kind, max_k, meter
        self.context = self.context_of(vocab_size)
        self._probes: dict[tuple[str, int], object] = {}

    @staticmethod
    def context_of(vocab_size: int) -> tuple[int, ...]:
        return tuple((1000 + i) % vocab_size for i in range(CONTEXT_TOKENS))

    def time(self, kind: str, width: int, depth: int) -> tuple[float, float]:
        """(wall ms, joules) of one call of the cell's probe."""
        probe = self._probe(kind, width)
        before, started = self.meter.read(), time.perf_counter()
        probe(depth)
        ms = (time.perf_counter() - started) * 1e3
        return ms, self.meter.read().since(before)

    def _probe(self, kind: str, width: int):
        key = (kind, width)
        if key not in self._probes:
            self._probes[key] = self._build(kind, width)
        return self._probes[key]

    def _build(self, kind: str, width: int):
        model = self.engine.model
        if kind == "verify":
            return VerifyProbe(model, width, self.context, self.max_k)
        if self.drafter_kind == "ngram":
            return ngram_draft(self.context * 16, width)
        if self.drafter_kind == "mtp":
            return MtpDraftProbe(self.engine.drafter.head, model, width, self.context)
        raise ValueError(f"no draft probe for drafter {self.drafter_kind!r}")

    def close(self) -> None:
        self._probes.clear()
