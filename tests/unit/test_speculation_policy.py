"""The speculation policy around the gate: settings, eligibility, the entry pin, recording."""

from types import SimpleNamespace

from runtime.eligibility import ThinkProgress
from runtime.gate import GateStep
from runtime.messages import SamplingParams
from runtime.speculation import SpeculationPolicy


def seq(emitted=0, disable_mtp=False, **params):
    return SimpleNamespace(think=ThinkProgress(post_think_emitted=emitted, emitted=emitted),
                           params=SamplingParams(disable_mtp=disable_mtp, **params))


def test_settings_and_environment():
    assert SpeculationPolicy("none", 3, env={}).choose([seq(100)], 10) == (GateStep.PLAIN, False)
    assert SpeculationPolicy("ngram", 3, "off", env={}).choose([seq(100)], 10) == (GateStep.PLAIN, False)
    assert SpeculationPolicy("ngram", 3, "force", env={}).choose([seq(100)], 10) == (GateStep.MTP, False)
    forced = SpeculationPolicy("ngram", 3, env={"METRALE_MTP_GATE_FORCE": "1"})
    assert forced.gate is None and forced.choose([seq(100)], 10) == (GateStep.MTP, False)
    assert SpeculationPolicy("ngram", 3, "auto", env={"METRALE_MTP_GATE_FORCE": "1"}).gate is not None


def test_disable_mtp_takes_a_plain_row_and_the_cap_keeps_wide_batches_plain():
    policy = SpeculationPolicy("ngram", 3, "force", env={}, mtp_max_seqs=4)
    assert policy.choose([seq(100), seq(100, disable_mtp=True)], 10) == (GateStep.MTP, False)
    assert policy.choose([seq(100, disable_mtp=True)], 10) == (GateStep.PLAIN, False)
    assert policy.next_is_plain([seq(100, disable_mtp=True)])
    assert policy.choose([seq(100)] * 4, 10) == (GateStep.MTP, False)
    assert policy.choose([seq(100)] * 5, 10) == (GateStep.PLAIN, False)


def test_entry_pin_forces_verify_for_new_sequences_and_is_not_recorded():
    policy = SpeculationPolicy("ngram", 3, "auto", env={"METRALE_SPEC_ENTRY_PIN": "8"})
    assert policy.choose([seq(3)], 10) == (GateStep.MTP, True)
    assert policy.choose([seq(8)], 10) == (GateStep.PLAIN, False)
    assert policy.choose([seq(20), seq(0)], 10) == (GateStep.MTP, True)  # one entering sequence pins all
    policy.record(GateStep.MTP, pinned=True, wall_s=0.1, width=1, tokens=3)
    assert policy.gate.snapshot()["window_steps"] == 0


def test_gauges_describe_the_gate():
    policy = SpeculationPolicy("ngram", 3, "auto", env={})
    policy.choose([seq(100)], 10)
    for _ in range(40):
        policy.record(GateStep.PLAIN, pinned=False, wall_s=0.05, width=1, tokens=1)
    gauges = dict(policy.gauges())
    assert gauges["gate_mode_mtp"] == 0.0 and gauges["gate_serial_tok_s"] > 0
    assert set(gauges) >= {"gate_mtp_tok_s", "gate_serial_stale", "gate_mtp_stale", "gate_width_bucket"}


def test_seeded_sampling_stays_reproducible_under_the_measuring_gate():
    auto = SpeculationPolicy("ngram", 3, "auto", env={})
    assert auto.choose([seq(100, temperature=0.8, seed=7)], 10) == (GateStep.PLAIN, False)
    assert auto.choose([seq(0, temperature=0.8)], 10) == (GateStep.MTP, True)  # unseeded: pinned entry
    assert auto.choose([seq(0, seed=7)], 10) == (GateStep.MTP, True)  # greedy is path-independent
    forced = SpeculationPolicy("ngram", 3, "force", env={})  # a fixed path: seeded runs repeat
    assert forced.choose([seq(100, temperature=0.8, seed=7)], 10) == (GateStep.MTP, False)


def _table(verify_ms, acceptance):
    """A synthetic table: verify cost per depth at every width, the same acceptance at every depth."""
    from runtime.cost_table import AcceptanceCalibration, Cost, TableMeta, make_table

    meta = TableMeta(schema_version=1, model_id="m", drafter="ngram", machine="x", dtype="float32", blas="b",
                     energy_source="cpu_proxy", watts_per_core=10.0, date="2026-11-29")
    return make_table(meta=meta, widths=(1, 4), depths=tuple(range(len(verify_ms))),
                      verify=lambda n, k: Cost(ms=verify_ms[k] * n ** 0.5, joules=verify_ms[k] * n ** 0.5 / 100),
                      draft=lambda n, k: Cost(ms=0.0, joules=0.0),
                      calibration=AcceptanceCalibration(confidence=(), acceptance=(), by_depth=(acceptance,) * 4))


def test_the_planner_sets_depth_and_keeps_a_prefix_of_drafts():
    cheap = SpeculationPolicy("ngram", 3, "force", env={}, table=_table([10, 11, 12, 13], 0.9))
    assert cheap.depth(1) == 3  # verifying is nearly free and drafts are good: go deep
    assert cheap.allot([(), ()], [3, 1]) == [3, 1]
    dear = SpeculationPolicy("ngram", 3, "force", env={}, table=_table([10, 20, 30, 40], 0.1))
    assert dear.depth(1) == 0 and dear.snapshot()["planner_depth"] == {"depth": 0, "reason": "cost_model"}
    capped = SpeculationPolicy("ngram", 3, "force", env={}, table=_table([10, 11, 12, 13], 0.9), mtp_max_seqs=2)
    assert capped.depth(4) == 0 and capped.last_depth == (0, "over_cap")
    assert SpeculationPolicy("ngram", 3, "force", env={}).depth(1) == 3  # no table: the configured K


def test_where_the_planner_says_no_draft_pays_steps_are_plain_even_under_the_pin():
    policy = SpeculationPolicy("ngram", 3, "auto", env={"METRALE_SPEC_ENTRY_PIN": "8"},
                               table=_table([10, 20, 30, 40], 0.1))
    assert policy.choose([seq(0)], 10) == (GateStep.PLAIN, False)
    assert policy.next_is_plain([seq(0)])
    paying = SpeculationPolicy("ngram", 3, "auto", env={"METRALE_SPEC_ENTRY_PIN": "8"},
                               table=_table([10, 11, 12, 13], 0.9))
    assert paying.choose([seq(0)], 10) == (GateStep.MTP, True)
    assert not paying.next_is_plain([seq(0)])
