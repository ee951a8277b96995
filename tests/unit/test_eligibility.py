"""Speculative dispatch eligibility, the think counter, the entry pin and the gate switch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.eligibility import (
    DEFAULT_ENTRY_PIN_TOKENS,
    GateSetting,
    ThinkMarkers,
    ThinkProgress,
    entry_pin_forces_verify,
    entry_pin_tokens_from_env,
    gate_forced_from_env,
    gate_setting,
    spec_dispatch_eligible,
    spec_think_from_env,
    think_progress,
)
from runtime.gate import GateStep

THINK, END = 100, 101
MARKERS = ThinkMarkers(start=THINK, end=END)
outputs = st.lists(st.sampled_from([1, 2, 3, THINK, END]), max_size=60)


# -- the think counter -----------------------------------------------------------------------------


def test_counts_tokens_after_the_latest_think_end():
    progress = think_progress([THINK, 5, 6, END, 7, 8, THINK, 9, END, 10], MARKERS)
    assert progress == ThinkProgress(inside_think=False, post_think_emitted=1, emitted=10)


def test_inside_think():
    progress = think_progress([1, 2, THINK, 3], MARKERS)
    assert progress.inside_think and progress.emitted == 4


def test_template_that_opens_think_in_the_prompt():
    progress = think_progress([3, 4, END, 5], MARKERS, starts_inside=True)
    assert progress == ThinkProgress(inside_think=False, post_think_emitted=1, emitted=4)


def test_without_markers_every_token_counts():
    progress = think_progress([THINK, 1, END, 2], ThinkMarkers())
    assert progress == ThinkProgress(inside_think=False, post_think_emitted=4, emitted=4)


@settings(max_examples=200, deadline=None)
@given(outputs, st.integers(0, 60))
def test_advancing_in_pieces_equals_counting_at_once(ids, cut):
    whole = think_progress(ids, MARKERS)
    assert think_progress(ids[:cut], MARKERS).advance(ids[cut:], MARKERS) == whole
    assert whole.emitted == len(ids)
    assert 0 <= whole.post_think_emitted <= whole.emitted


# -- spec_dispatch_eligible ------------------------------------------------------------------------

OUTSIDE = ThinkProgress(inside_think=False, post_think_emitted=5, emitted=30)
INSIDE = ThinkProgress(inside_think=True, post_think_emitted=0, emitted=30)


@pytest.mark.parametrize("flag", ["suppress_tool_call", "disable_mtp"])
def test_never_with_tool_call_suppression_or_mtp_disabled(flag):
    assert not spec_dispatch_eligible(OUTSIDE, resume_guard=0, spec_think=True, **{flag: True})


def test_resume_guard_counts_after_think_end():
    assert spec_dispatch_eligible(OUTSIDE, resume_guard=5)
    assert not spec_dispatch_eligible(OUTSIDE, resume_guard=6)  # 30 emitted, only 5 after </think>


def test_never_inside_think_without_spec_think():
    assert not spec_dispatch_eligible(INSIDE, resume_guard=0)


def test_inside_think_with_spec_think_the_whole_output_counts():
    assert spec_dispatch_eligible(INSIDE, resume_guard=30, spec_think=True)
    assert not spec_dispatch_eligible(INSIDE, resume_guard=31, spec_think=True)


@settings(max_examples=200, deadline=None)
@given(outputs, st.integers(0, 20), st.booleans(), st.booleans(), st.booleans())
def test_eligibility_rules(ids, guard, spec_think, suppress, disable):
    progress = think_progress(ids, MARKERS)
    eligible = spec_dispatch_eligible(
        progress, resume_guard=guard, spec_think=spec_think, suppress_tool_call=suppress, disable_mtp=disable
    )
    if suppress or disable or (progress.inside_think and not spec_think):
        assert not eligible
    elif progress.inside_think:
        assert eligible == (len(ids) >= guard)
    else:
        assert eligible == (progress.post_think_emitted >= guard)


# -- the entry pin ---------------------------------------------------------------------------------


def test_entry_pin_default_and_override():
    assert entry_pin_tokens_from_env({}) == DEFAULT_ENTRY_PIN_TOKENS == 8
    assert entry_pin_tokens_from_env({"METRALE_SPEC_ENTRY_PIN": "3"}) == 3
    assert entry_pin_tokens_from_env({"METRALE_SPEC_ENTRY_PIN": " "}) == 8
    assert entry_pin_tokens_from_env({"METRALE_SPEC_ENTRY_PIN": "0"}) == 0


@pytest.mark.parametrize("raw", ["eight", "-1", "2.5"])
def test_entry_pin_rejects_nonsense(raw):
    with pytest.raises(ValueError, match="METRALE_SPEC_ENTRY_PIN"):
        entry_pin_tokens_from_env({"METRALE_SPEC_ENTRY_PIN": raw})


def test_one_entering_sequence_pins_the_batch():
    batch_post_think = [40, 3, 100]  # the minimum over the active batch decides
    assert entry_pin_forces_verify(GateStep.PLAIN, min_post_think_emitted=min(batch_post_think), pin_tokens=8)
    assert not entry_pin_forces_verify(GateStep.PLAIN, min_post_think_emitted=8, pin_tokens=8)


def test_the_pin_overrides_only_a_plain_decision():
    assert not entry_pin_forces_verify(GateStep.MTP, min_post_think_emitted=0, pin_tokens=8)
    assert not entry_pin_forces_verify(GateStep.PLAIN, min_post_think_emitted=0, pin_tokens=0)


# -- switches from the environment ---------------------------------------------------------------


def test_spec_think_only_with_exactly_one():
    assert spec_think_from_env({"METRALE_DFLASH_SPEC_THINK": "1"})
    assert not spec_think_from_env({"METRALE_DFLASH_SPEC_THINK": "0"})
    assert not spec_think_from_env({})


@pytest.mark.parametrize(
    "raw, forced", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False)]
)
def test_gate_force_env(raw, forced):
    assert gate_forced_from_env({"METRALE_MTP_GATE_FORCE": raw}) is forced


def test_gate_setting_cli_wins_over_env():
    forced = {"METRALE_MTP_GATE_FORCE": "1"}
    assert gate_setting(None, {}) is GateSetting.AUTO
    assert gate_setting(None, forced) is GateSetting.FORCE
    assert gate_setting("off", forced) is GateSetting.OFF
    assert gate_setting("auto", forced) is GateSetting.AUTO
    with pytest.raises(ValueError):
        gate_setting("sometimes", {})
