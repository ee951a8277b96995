"""The MTP runtime gate (spec/mtp_gate.md): plain decode or the MTP verify step, chosen by measurement.

Pure policy: no asyncio, no MLX, no clock. The scheduler passes each step's wall time in.

Usage (one gate per serve, built when MTP is on and the gate is not forced):

    gate = MtpGate()                       # or MtpGate(GateConfig(...))
    gate.note_width(len(batch))            # a new power-of-two bucket discards the open window
    gate.maybe_remeasure(context_depth)    # a depth regime change marks both estimates stale
    step = gate.next_step()                # GateStep.PLAIN or GateStep.MTP; a query, no side effect
    ...run the step (or the MTP step under an entry pin)...
    gate.record(step, wall_s=dt, width=n, tokens_emitted=k, pinned=pin)
    if (decision := gate.take_fresh_decision()) is not None: ...trace and telemetry...
    gate.snapshot()                        # plain dict for /health and telemetry

Policy:
- Windows of `window_steps` recorded steps, all of one mode and one width bucket. Each closed window
  folds its tok/s (tokens charged / step wall time, leaving out its slowest step) into that mode's
  `ModeStats`, then arbitrates.
- Accounting is whole-batch: a plain step over n sequences is charged n tokens, a verify step the
  tokens all its sequences emitted.
- Arbitration switches mode when both modes have a fresh (not stale) estimate and the other mode
  beat the current one by `margin` in `dwell_windows` consecutive arbitrations. Stricter than the
  spec in two ways: the current mode must be fresh too, so a switch never compares estimates from
  two regimes; and the other mode must beat both the current EWMA and the current mode's latest
  window, so one stalled window cannot flip the mode.
- EWMA decay is per window of elapsed time, not per window of that mode: a mode measured again after
  k windows away keeps (1 - weight)^k of its old estimate. Probes come 16+ windows apart, so a probe
  is judged on what it measured now, not outvoted by probes from before a flip.
- Probes: in Serial, MTP is probed for one window after `reprobe_tokens`; in Mtp, serial is
  refreshed for one window after `serial_refresh_tokens`. A mode with no estimate, or a stale one,
  is probed as soon as the current mode has a fresh estimate (the probe "brought forward").
- Deviation from the literal spec: probe intervals count tokens per sequence (charged tokens / width),
  so probes take the same share of steps at every batch width. Counting whole-batch tokens would
  probe every other window at width 8, which alone costs more than the 5% margin when MTP loses.
- Staleness: a new width bucket (`note_width`) or a context-depth regime change (`maybe_remeasure`)
  marks both estimates stale. A stale estimate is replaced, not blended, by its next window:
  tok/s at another width or depth is a different quantity.
- Steps run under a pin, and steps that are not the one `next_step()` asked for, are not recorded.

Where the served path departs from the spec: this gate decides only without a cost table
(`--spec-cost-model off`, or the seconds before a self-calibration ends). With one, the online
controller (runtime/controller.py) decides every step from measured costs and each request's own
acceptance, and its exploration replaces the gate's fixed probes and the entry pin. Why: served on
a machine whose CPU differed from the table's, the gate sat in plain decode while the pin and probes
made 15% of all steps speculative, each a loss on chat (0.935x); windows of whole-batch tok/s cannot
tell one request that pays from another that does not, and in mtp_batch one entering sequence
pinned the whole batch without being measured. The controller explores only where the upper bound
of a request's acceptance says a draft might pay, from an allowance of 1% of plain decode time. The
gate's own invariants (above) hold whenever it runs, and keep their property tests.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

EWMA_WEIGHT = 0.3  # reference runtime
WINDOW_STEPS = 16  # reference runtime
SWITCH_MARGIN = 0.05  # reference runtime
REPROBE_TOKENS = 256  # reference runtime; per sequence here (see the module doc)
# Two arbitrations: one noisy window cannot flip the mode, and a real change costs one extra window.
SWITCH_DWELL_WINDOWS = 2
# Mtp steps emit 1.5-3 tokens per sequence, so 4x the reprobe interval keeps the serial refresh near
# the same share of steps (~3-6%); Mtp slowing down shows in its own EWMA without a refresh.
SERIAL_REFRESH_TOKENS = 1024
# Context depth (KV positions). Doubling it changes attention cost enough to reorder the modes;
# below 2048 attention is a small share of a step, so small contexts form one regime.
REMEASURE_DEPTH_FACTOR = 2.0
REMEASURE_DEPTH_FLOOR = 2048


class GateMode(enum.Enum):
    SERIAL = "serial"
    MTP = "mtp"

    @property
    def other(self) -> GateMode:
        return GateMode.MTP if self is GateMode.SERIAL else GateMode.SERIAL


class GateStep(enum.Enum):
    """The step the gate wants the scheduler to run next."""

    PLAIN = "plain"
    MTP = "mtp"


STEP_OF_MODE = {GateMode.SERIAL: GateStep.PLAIN, GateMode.MTP: GateStep.MTP}


def _doc(kind, text: str):
    return Annotated[kind, msgspec.Meta(description=text)]


class GateConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The gate's settings: Config.gate, flags --gate-*."""

    window_steps: _doc(int, "steps in one measurement window of the gate") = WINDOW_STEPS
    ewma_weight: _doc(float, "weight of the newest window in a mode's tok/s estimate") = EWMA_WEIGHT
    margin: _doc(float, "the other mode must beat the current one by this share to switch") = SWITCH_MARGIN
    dwell_windows: _doc(int, "arbitrations in a row the other mode must win") = SWITCH_DWELL_WINDOWS
    reprobe_tokens: _doc(int, "per-sequence tokens of plain decode between probes of speculation") = REPROBE_TOKENS
    serial_refresh_tokens: _doc(int, "per-sequence tokens of speculation between plain refreshes") = \
        SERIAL_REFRESH_TOKENS
    remeasure_depth_factor: _doc(float, "a context-depth change by this factor re-measures both modes") = \
        REMEASURE_DEPTH_FACTOR
    remeasure_depth_floor: _doc(int, "context depths below this form one regime") = REMEASURE_DEPTH_FLOOR
    initial_mode: _doc(GateMode, "the mode the gate starts in (serial: speculation proves itself first)") = \
        GateMode.SERIAL


class ModeStats(msgspec.Struct, frozen=True, kw_only=True):
    """One mode's delivered throughput: EWMA of window tok/s and EWMA of its absolute deviation."""

    tok_s: float | None = None
    dev_tok_s: float = 0.0
    last_tok_s: float | None = None  # the latest window alone
    windows: int = 0
    stale: bool = False

    @property
    def fresh(self) -> bool:
        return self.tok_s is not None and not self.stale

    def update(self, window_tok_s: float, weight: float = EWMA_WEIGHT, *, elapsed: int = 1) -> ModeStats:
        """Fold one window in. elapsed: windows (of either mode) since this mode's last one.

        The old estimate decays by (1 - weight) per elapsed window, so a probe after 16 windows away
        mostly replaces it instead of being outvoted by probes made in another regime.
        """
        if self.tok_s is None or self.stale:
            return ModeStats(tok_s=window_tok_s, last_tok_s=window_tok_s, windows=self.windows + 1)
        keep = (1 - weight) ** max(elapsed, 1)
        dev = keep * self.dev_tok_s + (1 - keep) * abs(window_tok_s - self.tok_s)
        tok_s = keep * self.tok_s + (1 - keep) * window_tok_s
        return ModeStats(tok_s=tok_s, dev_tok_s=dev, last_tok_s=window_tok_s, windows=self.windows + 1)

    def mark_stale(self) -> ModeStats:
        return msgspec.structs.replace(self, stale=self.tok_s is not None)


class Window(msgspec.Struct, frozen=True, kw_only=True):
    """The open measurement window: steps of one mode within one width bucket."""

    mode: GateMode
    bucket: int
    steps: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    slowest_s: float = 0.0  # the slowest step, and the tokens it emitted
    slowest_tokens: int = 0

    def add(self, tokens: int, wall_s: float) -> Window:
        slowest = wall_s > self.slowest_s
        return msgspec.structs.replace(
            self,
            steps=self.steps + 1,
            tokens=self.tokens + tokens,
            wall_s=self.wall_s + wall_s,
            slowest_s=wall_s if slowest else self.slowest_s,
            slowest_tokens=tokens if slowest else self.slowest_tokens,
        )

    @property
    def tok_s(self) -> float:
        # Leave the slowest step out: a one-off stall (GC, page faults) belongs to neither mode, and
        # one 4x stall would move a 16-step window by 16%, three times the switch margin.
        if self.steps < 3:
            return self.tokens / self.wall_s
        return (self.tokens - self.slowest_tokens) / (self.wall_s - self.slowest_s)


class GateDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A mode switch, handed to the scheduler once (take_fresh_decision)."""

    mode: GateMode
    previous: GateMode
    serial_tok_s: float
    mtp_tok_s: float
    width_bucket: int
    window: int  # closed-window count when it was taken


def width_bucket(width: int) -> int:
    """The power-of-two bucket holding width: 1, 2, 3-4 -> 4, 5-8 -> 8, ..."""
    return 1 << (width - 1).bit_length()


class MtpGate:
    def __init__(self, config: GateConfig = GateConfig()):
        self.config = config
        self.mode = config.initial_mode
        self.stats = {GateMode.SERIAL: ModeStats(), GateMode.MTP: ModeStats()}
        self.window: Window | None = None
        self.bucket: int | None = None
        self.windows_closed = 0
        self.switches = 0
        self._seq_tokens_since_other = 0.0  # per-sequence tokens recorded since the other mode's window
        self._dwell = 0
        self._depth_anchor: int | None = None
        self._last_window_of = {GateMode.SERIAL: 0, GateMode.MTP: 0}  # windows_closed at its last window
        self._fresh_decision: GateDecision | None = None

    # -- what to run ------------------------------------------------------------------------------

    def next_step(self) -> GateStep:
        return STEP_OF_MODE[self._measuring_mode()]

    def _measuring_mode(self) -> GateMode:
        if self.window is not None:
            return self.window.mode  # finish the open window first
        return self.mode.other if self._probe_due() else self.mode

    def _probe_due(self) -> bool:
        if not self.stats[self.mode].fresh:
            return False  # measure the current mode first, so the comparison is like for like
        if not self.stats[self.mode.other].fresh:
            return True
        return self._seq_tokens_since_other >= self._probe_interval()

    def _probe_interval(self) -> int:
        if self.mode is GateMode.SERIAL:
            return self.config.reprobe_tokens
        return self.config.serial_refresh_tokens

    # -- what happened ----------------------------------------------------------------------------

    def record(
        self,
        step: GateStep,
        *,
        wall_s: float,
        width: int,
        tokens_emitted: int | None = None,
        pinned: bool = False,
    ) -> bool:
        """Record a step the scheduler ran; True if it was counted. MTP steps need tokens_emitted."""
        if pinned or width <= 0 or wall_s <= 0:
            return False
        self.note_width(width)
        mode = self._measuring_mode()
        if step is not STEP_OF_MODE[mode]:
            return False  # not the step the gate asked for
        charged = width if step is GateStep.PLAIN else _required(tokens_emitted)
        if mode is self.mode:
            self._seq_tokens_since_other += charged / width
        window = self.window or Window(mode=mode, bucket=width_bucket(width))
        self.window = window.add(charged, wall_s)
        if self.window.steps >= self.config.window_steps:
            self._close_window()
        return True

    def note_width(self, width: int) -> bool:
        """Note the batch width; True if it moved to a new bucket (both estimates become stale)."""
        if width <= 0:
            return False
        bucket = width_bucket(width)
        if bucket == self.bucket:
            return False
        first = self.bucket is None
        self.bucket = bucket
        self.window = None  # a window never mixes buckets
        if not first:
            self._mark_stale()
        return not first

    def maybe_remeasure(self, depth: int) -> bool:
        """Note the context depth; True if it left its regime (both estimates become stale)."""
        level = max(depth, self.config.remeasure_depth_floor)
        if self._depth_anchor is None:
            self._depth_anchor = level
            return False
        ratio = level / self._depth_anchor
        factor = self.config.remeasure_depth_factor
        if 1 / factor < ratio < factor:
            return False
        self._depth_anchor = level
        self._mark_stale()
        return True

    def take_fresh_decision(self) -> GateDecision | None:
        """The latest switch not yet handed out, once."""
        decision, self._fresh_decision = self._fresh_decision, None
        return decision

    # -- internals --------------------------------------------------------------------------------

    def _mark_stale(self) -> None:
        self.stats = {mode: stats.mark_stale() for mode, stats in self.stats.items()}
        self._dwell = 0

    def _close_window(self) -> None:
        window, self.window = self.window, None
        assert window is not None
        elapsed = self.windows_closed - self._last_window_of[window.mode]
        self.stats[window.mode] = self.stats[window.mode].update(
            window.tok_s, self.config.ewma_weight, elapsed=elapsed
        )
        if window.mode is not self.mode:
            self._seq_tokens_since_other = 0.0  # the probe (or refresh) is done
        self.windows_closed += 1
        self._last_window_of[window.mode] = self.windows_closed
        self._arbitrate()

    def _arbitrate(self) -> None:
        """The only place the mode changes (spec: arbitrate)."""
        current, other = self.stats[self.mode], self.stats[self.mode.other]
        beaten = current.fresh and other.fresh and other.tok_s > _defence(current) * (1 + self.config.margin)
        self._dwell = self._dwell + 1 if beaten else 0
        if self._dwell < self.config.dwell_windows:
            return
        serial, mtp = self.stats[GateMode.SERIAL], self.stats[GateMode.MTP]
        self._fresh_decision = GateDecision(
            mode=self.mode.other,
            previous=self.mode,
            serial_tok_s=serial.tok_s,
            mtp_tok_s=mtp.tok_s,
            width_bucket=self.bucket or 1,
            window=self.windows_closed,
        )
        self.mode = self.mode.other
        self.switches += 1
        self._dwell = 0
        self._seq_tokens_since_other = 0.0  # the mode left behind was measured just now

    # -- telemetry --------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """Plain-data state for telemetry samples and /health."""
        window = self.window
        return {
            "mode": self.mode.value,
            "next_step": self.next_step().value,
            "probing": self._measuring_mode() is not self.mode,
            "serial": _stats_dict(self.stats[GateMode.SERIAL]),
            "mtp": _stats_dict(self.stats[GateMode.MTP]),
            "width_bucket": self.bucket,
            "windows": self.windows_closed,
            "window_steps": window.steps if window else 0,
            "dwell": self._dwell,
            "switches": self.switches,
            "tokens_since_other": self._seq_tokens_since_other,
        }


def _defence(current: ModeStats) -> float:
    # The incumbent's latest window must lose too, so one bad window (a stall) cannot flip the mode.
    return max(current.tok_s, current.last_tok_s)


def _stats_dict(stats: ModeStats) -> dict:
    return msgspec.structs.asdict(stats)


def _required(tokens_emitted: int | None) -> int:
    if tokens_emitted is None:
        raise ValueError("an MTP step is charged the tokens it emitted: pass tokens_emitted")
    return tokens_emitted
