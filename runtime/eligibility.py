"""Speculative dispatch eligibility, the spec-entry pin and the gate switch (spec/mtp_gate.md).

Pure: environment variables are read only through an `env` argument (os.environ by default), so
tests pass dicts.

- `spec_dispatch_eligible(...)`: may one sequence take the speculative path (MTP or DFlash) this step?
- `think_progress(ids, markers)` / `ThinkProgress.advance(ids, markers)`: where a sequence stands
  relative to <think> ... </think>, and how many tokens it emitted since the last </think>.
- `entry_pin_tokens_from_env(env)` (METRALE_SPEC_ENTRY_PIN, default 8) and
  `entry_pin_forces_verify(...)`: the first tokens after </think> run the verify step even when the
  gate says plain, so a sequence entering speculation is measured speculating.
- `spec_think_from_env(env)` (METRALE_DFLASH_SPEC_THINK=1 allows speculation inside <think>).
- `gate_setting(cli_value, env)` / `gate_forced_from_env(env)` (METRALE_MTP_GATE_FORCE):
  auto builds a gate, force builds none and speculates whenever eligible, off never speculates.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping

import msgspec

from runtime.gate import GateStep

ENTRY_PIN_ENV = "METRALE_SPEC_ENTRY_PIN"
SPEC_THINK_ENV = "METRALE_DFLASH_SPEC_THINK"
GATE_FORCE_ENV = "METRALE_MTP_GATE_FORCE"
DEFAULT_ENTRY_PIN_TOKENS = 8  # reference runtime
_TRUTHY = frozenset({"1", "true", "yes", "on"})


class ThinkMarkers(msgspec.Struct, frozen=True, kw_only=True):
    """The tokenizer's <think> and </think> token ids; None where it defines none."""

    start: int | None = None
    end: int | None = None


class ThinkProgress(msgspec.Struct, frozen=True, kw_only=True):
    inside_think: bool = False
    post_think_emitted: int = 0  # emitted outside <think> since the last </think> (or the start)
    emitted: int = 0  # the whole output, markers included

    def advance(self, token_ids: Iterable[int], markers: ThinkMarkers) -> ThinkProgress:
        inside, post, emitted = self.inside_think, self.post_think_emitted, self.emitted
        for token in token_ids:
            emitted += 1
            if markers.start is not None and token == markers.start:
                inside = True
            elif markers.end is not None and token == markers.end:
                inside, post = False, 0  # the resume guard counts from the latest </think>
            elif not inside:
                post += 1
        return ThinkProgress(inside_think=inside, post_think_emitted=post, emitted=emitted)


def think_progress(
    token_ids: Iterable[int], markers: ThinkMarkers, *, starts_inside: bool = False
) -> ThinkProgress:
    """Progress over a whole output. starts_inside: the prompt template already opened <think>."""
    return ThinkProgress(inside_think=starts_inside).advance(token_ids, markers)


def spec_dispatch_eligible(
    progress: ThinkProgress,
    *,
    resume_guard: int,
    spec_think: bool = False,
    suppress_tool_call: bool = False,
    disable_mtp: bool = False,
) -> bool:
    """Whether one sequence may take the speculative path (MTP or DFlash alike) this step."""
    if suppress_tool_call or disable_mtp:
        return False
    if progress.inside_think:
        # Reachable only with spec_think; there the whole output counts toward the guard.
        return spec_think and progress.emitted >= resume_guard
    return progress.post_think_emitted >= resume_guard


def entry_pin_forces_verify(step: GateStep, *, min_post_think_emitted: int, pin_tokens: int) -> bool:
    """Whether the entry pin overrides a plain (Serial) gate step for an already eligible batch.

    min_post_think_emitted is the minimum over the active batch: one entering sequence pins it all.
    """
    return step is GateStep.PLAIN and min_post_think_emitted < pin_tokens


def entry_pin_tokens_from_env(env: Mapping[str, str] = os.environ) -> int:
    """The pin width from METRALE_SPEC_ENTRY_PIN (default 8; 0 turns the pin off)."""
    raw = env.get(ENTRY_PIN_ENV, "").strip()
    if not raw:
        return DEFAULT_ENTRY_PIN_TOKENS
    try:
        tokens = int(raw)
    except ValueError:
        raise ValueError(f"{ENTRY_PIN_ENV}={raw!r}: expected a whole number of tokens") from None
    if tokens < 0:
        raise ValueError(f"{ENTRY_PIN_ENV}={raw!r}: must be >= 0")
    return tokens


def spec_think_from_env(env: Mapping[str, str] = os.environ) -> bool:
    """METRALE_DFLASH_SPEC_THINK=1 allows speculation inside <think>."""
    return env.get(SPEC_THINK_ENV, "").strip() == "1"


class GateSetting(enum.Enum):
    AUTO = "auto"  # the gate decides by measurement
    FORCE = "force"  # no gate: speculate whenever eligible
    OFF = "off"  # never speculate


def gate_forced_from_env(env: Mapping[str, str] = os.environ) -> bool:
    return env.get(GATE_FORCE_ENV, "").strip().lower() in _TRUTHY


def gate_setting(cli_value: str | None = None, env: Mapping[str, str] = os.environ) -> GateSetting:
    """--mtp-gate wins when given; otherwise METRALE_MTP_GATE_FORCE means force; else auto."""
    if cli_value is not None:
        return GateSetting(cli_value)
    return GateSetting.FORCE if gate_forced_from_env(env) else GateSetting.AUTO
