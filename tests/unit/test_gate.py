"""Property tests of the MTP gate (spec/mtp_gate.md), driven by synthetic step streams."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.bench import gate_sim
from runtime.gate import STEP_OF_MODE, GateConfig, GateMode, GateStep, ModeStats, MtpGate, width_bucket

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Segment:
    """A stretch of steps with one batch width and one cost profile."""

    width: int
    plain_s: float
    verify_cost: float  # a verify step costs this many plain steps
    tokens_per_seq: float  # mean tokens a verify step emits per sequence
    length: int
    pin_every: int  # 0: no pins; k: every k-th step runs under a pin
    depth: int


@dataclass
class Observed:
    """What one driven step looked like from outside the gate."""

    before: dict
    after: dict
    step: GateStep
    width: int
    pinned: bool
    recorded: bool
    decision: object


@dataclass
class Run:
    gate: MtpGate
    log: list[Observed] = field(default_factory=list)


segments = st.builds(
    Segment,
    width=st.sampled_from([1, 2, 3, 4, 5, 8, 9]),
    plain_s=st.floats(0.01, 0.1),
    verify_cost=st.floats(1.0, 2.0),
    tokens_per_seq=st.floats(1.0, 3.0),
    length=st.integers(1, 80),
    pin_every=st.sampled_from([0, 0, 0, 3, 7]),
    depth=st.sampled_from([100, 3000, 5000, 20000]),
)
configs = st.builds(
    GateConfig,
    window_steps=st.integers(2, 6),
    dwell_windows=st.integers(1, 3),
    reprobe_tokens=st.integers(4, 40),
    serial_refresh_tokens=st.integers(4, 80),
    initial_mode=st.sampled_from(list(GateMode)),
)


def drive(config: GateConfig, stream: list[Segment], seed: int, *, disobey_every: int = 0) -> Run:
    """Drive the gate as the scheduler does; every disobey_every-th step runs the other step kind."""
    rng, run, index = random.Random(seed), Run(MtpGate(config)), 0
    for segment in stream:
        for _ in range(segment.length):
            index += 1
            run.gate.note_width(segment.width)
            run.gate.maybe_remeasure(segment.depth)
            run.log.append(_one_step(run.gate, segment, rng, index, disobey_every))
    return run


def _one_step(gate: MtpGate, seg: Segment, rng: random.Random, index: int, disobey_every: int) -> Observed:
    before = gate.snapshot()
    step = gate.next_step()
    if disobey_every and index % disobey_every == 0:
        step = GateStep.MTP if step is GateStep.PLAIN else GateStep.PLAIN
    pinned = bool(seg.pin_every) and index % seg.pin_every == 0
    noise = rng.uniform(0.8, 1.25)
    if step is GateStep.MTP:
        wall, tokens = seg.plain_s * seg.verify_cost * noise, round(seg.width * seg.tokens_per_seq * noise)
    else:
        wall, tokens = seg.plain_s * noise, seg.width
    tokens = max(tokens, seg.width)
    recorded = gate.record(step, wall_s=wall, width=seg.width, tokens_emitted=tokens, pinned=pinned)
    decision = gate.take_fresh_decision()
    return Observed(before, gate.snapshot(), step, seg.width, pinned, recorded, decision)


def switches(run: Run) -> list[Observed]:
    return [o for o in run.log if o.before["mode"] != o.after["mode"]]


def closed_window(o: Observed) -> bool:
    return o.after["windows"] > o.before["windows"]


# -- invariants ----------------------------------------------------------------------------------


@PROPERTY
@given(configs, st.lists(segments, min_size=1, max_size=8), st.integers(0, 2**16))
def test_no_switch_without_two_fresh_estimates(config, stream, seed):
    for o in switches(drive(config, stream, seed)):
        for mode in ("serial", "mtp"):
            assert o.after[mode]["tok_s"] is not None
            assert not o.after[mode]["stale"]


@PROPERTY
@given(configs, st.lists(segments, min_size=1, max_size=8), st.integers(0, 2**16))
def test_switch_only_to_a_mode_that_won_by_the_margin(config, stream, seed):
    for o in switches(drive(config, stream, seed)):
        old, new = o.after[o.before["mode"]], o.after[o.after["mode"]]
        assert new["tok_s"] > (1 + config.margin) * max(old["tok_s"], old["last_tok_s"])


@PROPERTY
@given(configs, st.lists(segments, min_size=1, max_size=8), st.integers(0, 2**16))
def test_no_switch_before_the_dwell_count(config, stream, seed):
    """Shadow the arbitrations: a switch needs dwell_windows consecutive closed windows that won."""
    streak = 0
    for o in drive(config, stream, seed).log:
        if not closed_window(o):
            assert o.after["mode"] == o.before["mode"], "the mode changes only when a window closes"
            continue
        current, other = o.after[o.before["mode"]], o.after[_other(o.before["mode"])]
        won = _fresh(current) and _fresh(other) and other["tok_s"] > (1 + config.margin) * current["tok_s"]
        streak = streak + 1 if won else 0
        if o.after["mode"] != o.before["mode"]:
            assert streak >= config.dwell_windows
            streak = 0


@PROPERTY
@given(configs, st.lists(segments, min_size=2, max_size=8), st.integers(0, 2**16))
def test_no_window_spans_two_width_buckets(config, stream, seed):
    buckets: list[int] = []  # the bucket of each step in the open window, as seen from outside
    for o in drive(config, stream, seed).log:
        if o.before["window_steps"] == 0:
            buckets = []  # closed, or discarded by note_width
        if not o.recorded:
            assert o.after["window_steps"] == o.before["window_steps"]
            continue
        buckets.append(width_bucket(o.width))
        assert len(set(buckets)) == 1
        assert len(buckets) == (config.window_steps if closed_window(o) else o.after["window_steps"])


@PROPERTY
@given(configs, st.lists(segments, min_size=1, max_size=8), st.integers(0, 2**16))
def test_pinned_steps_are_never_recorded(config, stream, seed):
    for o in drive(config, stream, seed).log:
        if o.pinned:
            assert not o.recorded
            assert o.after == o.before


@PROPERTY
@given(configs, st.lists(segments, min_size=1, max_size=6), st.integers(0, 2**16), st.integers(2, 5))
def test_steps_the_gate_did_not_ask_for_are_not_recorded(config, stream, seed, disobey_every):
    run = drive(config, stream, seed, disobey_every=disobey_every)
    for o in run.log:
        if o.step.value != o.before["next_step"] and o.before["width_bucket"] == width_bucket(o.width):
            assert not o.recorded


@PROPERTY
@given(configs, st.lists(segments, min_size=1, max_size=8), st.integers(0, 2**16))
def test_each_decision_is_handed_out_once(config, stream, seed):
    run = drive(config, stream, seed)
    decisions = [o for o in run.log if o.decision is not None]
    assert decisions == switches(run)
    for o in decisions:
        assert o.decision.previous.value == o.before["mode"]
        assert o.decision.mode.value == o.after["mode"]
    assert run.gate.take_fresh_decision() is None


def _other(mode: str) -> str:
    return "mtp" if mode == "serial" else "serial"


def _fresh(stats: dict) -> bool:
    return stats["tok_s"] is not None and not stats["stale"]


# -- probes ----------------------------------------------------------------------------------------


@PROPERTY
@given(
    st.sampled_from(list(GateMode)),
    st.integers(1, 9),
    st.integers(2, 6),
    st.integers(4, 60),
    st.lists(st.integers(1, 4), min_size=1, max_size=40),
)
def test_probes_start_at_the_stated_token_counts(mode, width, window_steps, interval, mtp_tokens):
    """The incumbent clearly wins, so nothing switches; each probe waits for `interval` tokens/seq."""
    config = GateConfig(
        window_steps=window_steps, reprobe_tokens=interval, serial_refresh_tokens=interval, initial_mode=mode
    )
    gate, incumbent = MtpGate(config), STEP_OF_MODE[mode]
    fast, slow = 0.01, 0.1
    wall = {incumbent: fast, STEP_OF_MODE[mode.other]: slow}
    counted, boundaries, probes = 0.0, [0.0], 0  # per-sequence incumbent tokens since the last probe
    for i in range(40 * window_steps + 4 * interval):
        step = gate.next_step()
        if step is not incumbent and gate.window is None:  # a probe starts
            if gate.stats[mode.other].tok_s is not None:  # (the first one is brought forward)
                assert boundaries[-2] < interval <= counted  # due now, and not one window earlier
                probes += 1
            counted, boundaries = 0.0, [0.0]
        tokens = width * mtp_tokens[i % len(mtp_tokens)] if step is GateStep.MTP else width
        gate.record(step, wall_s=wall[step], width=width, tokens_emitted=tokens)
        if step is incumbent:
            counted += tokens / width
            if gate.window is None:
                boundaries.append(counted)
    assert gate.mode is mode and gate.switches == 0
    assert probes >= 1


def test_the_first_probe_follows_the_first_window():
    gate = MtpGate(GateConfig(window_steps=4))
    steps = [_run_step(gate, plain_s=0.05, verify_s=0.2, width=1) for _ in range(8)]
    assert steps == [GateStep.PLAIN] * 4 + [GateStep.MTP] * 4


def test_a_new_width_bucket_discards_the_window_and_brings_the_probe_forward():
    gate = MtpGate(GateConfig(window_steps=4, reprobe_tokens=10_000))
    for _ in range(8):
        _run_step(gate, plain_s=0.05, verify_s=0.2, width=1)
    _run_step(gate, plain_s=0.05, verify_s=0.2, width=1)
    assert gate.window is not None and gate.window.steps == 1
    assert gate.note_width(2) is True
    assert gate.window is None
    assert gate.stats[GateMode.SERIAL].stale and gate.stats[GateMode.MTP].stale
    steps = [_run_step(gate, plain_s=0.05, verify_s=0.2, width=2) for _ in range(8)]
    assert steps == [GateStep.PLAIN] * 4 + [GateStep.MTP] * 4  # long before 10_000 tokens
    assert not gate.stats[GateMode.SERIAL].stale and not gate.stats[GateMode.MTP].stale


def test_a_stale_estimate_cannot_win():
    """MTP measured far faster at width 1 (the dwell holds the switch); at width 4 it is stale."""
    gate = MtpGate(GateConfig(window_steps=2, dwell_windows=3, reprobe_tokens=10_000))
    for _ in range(4):
        _run_step(gate, plain_s=0.05, verify_s=0.06, width=1)
    assert gate.mode is GateMode.SERIAL and gate.snapshot()["dwell"] == 1
    gate.note_width(4)
    for _ in range(8):
        _run_step(gate, plain_s=0.5, verify_s=0.06, width=4)  # serial now far below MTP's old figure
        if gate.next_step() is GateStep.MTP:
            break
    assert gate.stats[GateMode.MTP].stale and not gate.stats[GateMode.SERIAL].stale
    assert gate.mode is GateMode.SERIAL and gate.take_fresh_decision() is None
    for _ in range(2):
        _run_step(gate, plain_s=0.5, verify_s=2.0, width=4)  # the probe: MTP lost its edge
    assert not gate.stats[GateMode.MTP].stale and gate.mode is GateMode.SERIAL


# -- accounting, statistics, depth ---------------------------------------------------------------


def test_whole_batch_accounting():
    gate = MtpGate(GateConfig(window_steps=2))
    for _ in range(2):
        gate.record(GateStep.PLAIN, wall_s=0.1, width=8, tokens_emitted=99)  # charged 8, not 99
    assert gate.stats[GateMode.SERIAL].tok_s == pytest.approx(80.0)
    for tokens in (20, 28):
        gate.record(GateStep.MTP, wall_s=0.2, width=8, tokens_emitted=tokens)
    assert gate.stats[GateMode.MTP].tok_s == pytest.approx(48 / 0.4)


def test_an_mtp_step_needs_its_token_count():
    gate = MtpGate(GateConfig(initial_mode=GateMode.MTP))
    with pytest.raises(ValueError):
        gate.record(GateStep.MTP, wall_s=0.1, width=1)


def test_a_window_leaves_its_slowest_step_out():
    gate = MtpGate(GateConfig(window_steps=4))
    for wall in (0.1, 0.1, 0.4, 0.1):
        gate.record(GateStep.PLAIN, wall_s=wall, width=1)
    assert gate.stats[GateMode.SERIAL].tok_s == pytest.approx(10.0)


def test_mode_stats_ewma():
    stats = ModeStats().update(100.0)
    assert (stats.tok_s, stats.dev_tok_s, stats.windows) == (100.0, 0.0, 1)
    stats = stats.update(50.0, 0.3)
    assert stats.tok_s == pytest.approx(85.0) and stats.dev_tok_s == pytest.approx(15.0)
    assert stats.last_tok_s == 50.0
    away = ModeStats().update(100.0).update(50.0, 0.3, elapsed=3)
    assert away.tok_s == pytest.approx(100 * 0.7**3 + 50 * (1 - 0.7**3))
    restarted = stats.mark_stale().update(10.0)
    assert restarted.tok_s == 10.0 and not restarted.stale
    assert not ModeStats().mark_stale().stale  # nothing to be stale about


def test_remeasure_on_depth_regime_change():
    gate = MtpGate(GateConfig(remeasure_depth_factor=2.0, remeasure_depth_floor=2048))
    gate.stats = {mode: ModeStats(tok_s=10.0) for mode in GateMode}
    assert gate.maybe_remeasure(100) is False  # anchors at the floor
    assert gate.maybe_remeasure(4000) is False  # below 2 x 2048
    assert gate.maybe_remeasure(10) is False
    assert gate.maybe_remeasure(4096) is True
    assert all(stats.stale for stats in gate.stats.values())
    assert gate.maybe_remeasure(6000) is False
    assert gate.maybe_remeasure(2048) is True  # halved


def test_width_buckets():
    assert [width_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]


# -- liveness and the benchmark ------------------------------------------------------------------


@pytest.mark.parametrize("verify_s, expected", [(0.06, GateMode.MTP), (0.2, GateMode.SERIAL)])
def test_the_gate_settles_on_the_faster_mode(verify_s, expected):
    gate = MtpGate()
    for _ in range(400):
        _run_step(gate, plain_s=0.058, verify_s=verify_s, width=1)
    assert gate.mode is expected
    assert gate.snapshot()["mode"] == expected.value


def test_gate_sim_stays_within_five_percent_of_the_best_fixed_mode(capsys):
    assert gate_sim.main(["--steps", "2000", "--seed", "0"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    name, value = last.split("=")
    assert name == "worst_ratio_vs_best_fixed"
    assert value == f"{float(value):.3f}" and float(value) >= 0.95


def _run_step(gate: MtpGate, *, plain_s: float, verify_s: float, width: int) -> GateStep:
    """One step as asked; a verify step emits two tokens per sequence."""
    step = gate.next_step()
    wall, tokens = (plain_s, width) if step is GateStep.PLAIN else (verify_s, 2 * width)
    gate.record(step, wall_s=wall, width=width, tokens_emitted=tokens)
    return step
