"""The speculation policy around the gate: settings, eligibility, the entry pin, recording."""

import itertools
from types import SimpleNamespace

from runtime.eligibility import ThinkProgress
from runtime.gate import GateStep
from runtime.messages import SamplingParams
from runtime.config import load_config, override, with_environment
from runtime.controller import OnlineController
from runtime.online_cost import PLAIN_FIRST, OnlineCostModel
from runtime.speculation import SpeculationPolicy


def seq(emitted=0, disable_mtp=False, request_id=None, **params):
    request_id = request_id or f"r{next(_ids)}"
    return SimpleNamespace(request_id=request_id, think=ThinkProgress(post_think_emitted=emitted, emitted=emitted),
                           params=SamplingParams(disable_mtp=disable_mtp, **params))


_ids = itertools.count()


def step(policy, batch, depth=10):
    choice = policy.choose(batch, depth)
    return choice.step, choice.pinned


def test_settings_and_environment():
    assert step(SpeculationPolicy("none", 3), [seq(100)]) == (GateStep.PLAIN, False)
    assert step(SpeculationPolicy("ngram", 3, "off"), [seq(100)]) == (GateStep.PLAIN, False)
    assert step(SpeculationPolicy("ngram", 3, "force"), [seq(100)]) == (GateStep.MTP, False)
    assert SpeculationPolicy("ngram", 3, "force").gate is None
    assert SpeculationPolicy("ngram", 3, "auto").gate is not None
    # The environment is read once, into Config; --mtp-gate given wins over it.
    forced = with_environment(load_config(), {"METRALE_MTP_GATE_FORCE": "1", "METRALE_SPEC_ENTRY_PIN": "3"})
    assert forced.spec.mtp_gate == "force" and forced.spec.entry_pin_tokens == 3
    given = override(load_config(), "spec", mtp_gate="auto")
    assert with_environment(given, {"METRALE_MTP_GATE_FORCE": "1"}).spec.mtp_gate == "auto"


def test_disable_mtp_takes_a_plain_row_and_the_cap_keeps_wide_batches_plain():
    policy = SpeculationPolicy("ngram", 3, "force", mtp_max_seqs=4)
    assert step(policy, [seq(100), seq(100, disable_mtp=True)]) == (GateStep.MTP, False)
    assert step(policy, [seq(100, disable_mtp=True)]) == (GateStep.PLAIN, False)
    assert policy.next_is_plain([seq(100, disable_mtp=True)])
    assert step(policy, [seq(100)] * 4) == (GateStep.MTP, False)
    assert step(policy, [seq(100)] * 5) == (GateStep.PLAIN, False)


def test_entry_pin_forces_verify_for_new_sequences_and_is_not_recorded():
    policy = SpeculationPolicy("ngram", 3, "auto", pin_tokens=8)
    assert step(policy, [seq(3)]) == (GateStep.MTP, True)
    assert step(policy, [seq(8)]) == (GateStep.PLAIN, False)
    assert step(policy, [seq(20), seq(0)]) == (GateStep.MTP, True)  # one entering sequence pins all
    policy.record(policy.choose([seq(3)], 10), wall_s=0.1, width=1, tokens=3)
    assert policy.gate.snapshot()["window_steps"] == 0


def test_gauges_describe_the_gate():
    policy = SpeculationPolicy("ngram", 3, "auto")
    plain = policy.choose([seq(100)], 10)
    for _ in range(40):
        policy.record(plain, wall_s=0.05, width=1, tokens=1)
    gauges = dict(policy.gauges())
    assert gauges["gate_mode_mtp"] == 0.0 and gauges["gate_serial_tok_s"] > 0
    assert set(gauges) >= {"gate_mtp_tok_s", "gate_serial_stale", "gate_mtp_stale", "gate_width_bucket"}


def test_seeded_sampling_stays_reproducible_under_the_measuring_gate():
    auto = SpeculationPolicy("ngram", 3, "auto")
    assert step(auto, [seq(100, temperature=0.8, seed=7)]) == (GateStep.PLAIN, False)
    assert step(auto, [seq(0, temperature=0.8)]) == (GateStep.MTP, True)  # unseeded: pinned entry
    assert step(auto, [seq(0, seed=7)]) == (GateStep.MTP, True)  # greedy is path-independent
    forced = SpeculationPolicy("ngram", 3, "force")  # a fixed path: seeded runs repeat
    assert step(forced, [seq(100, temperature=0.8, seed=7)]) == (GateStep.MTP, False)


def _table(verify_ms, acceptance):
    """A synthetic table: verify cost per depth at every width, the same acceptance at every depth."""
    from runtime.cost_table import AcceptanceCalibration, Cost, TableMeta, make_table

    meta = TableMeta(schema_version=1, model_id="m", drafter="ngram", machine="x", dtype="float32", blas="b",
                     energy_source="cpu_proxy", watts_per_core=10.0, date="2026-11-29")
    return make_table(meta=meta, widths=(1, 4), depths=tuple(range(len(verify_ms))),
                      verify=lambda n, k: Cost(ms=verify_ms[k] * n ** 0.5, joules=verify_ms[k] * n ** 0.5 / 100),
                      draft=lambda n, k: Cost(ms=0.0, joules=0.0),
                      calibration=AcceptanceCalibration(confidence=(), acceptance=(), by_depth=(acceptance,) * 4))


def controlled(setting, table, **kw):
    costs = OnlineCostModel(table, "test")
    plain = table.verify_cost(1, 0)
    for _ in range(PLAIN_FIRST):  # plain decode measured at the prior's cost: the reference is in, nothing moved
        costs.observe("verify", 1, 0, plain.ms, plain.joules)
    controller = OnlineController(costs, max_k=3, slack=0.1, mtp_max_seqs=kw.get("mtp_max_seqs", 32))
    return SpeculationPolicy("ngram", 3, setting, controller=controller, **kw)


def test_the_planner_sets_depth_and_keeps_a_prefix_of_drafts():
    cheap = controlled("force", _table([10, 11, 12, 13], 0.9))
    assert cheap.choose([seq(100)], 10).depths == (3,)  # verifying is nearly free and drafts are good: go deep
    assert cheap.allot([seq(100, objective="energy")] * 2, [(), ()], [3, 1]) == [3, 1]
    dear = controlled("force", _table([10, 20, 30, 40], 0.1))
    assert dear.choose([seq(100)], 10).depths == (0,) and dear.snapshot()["last_step"]["step"] == "plain"
    capped = controlled("force", _table([10, 11, 12, 13], 0.9), mtp_max_seqs=2)
    assert capped.choose([seq(100)] * 4, 10).step is GateStep.PLAIN
    assert SpeculationPolicy("ngram", 3, "force").choose([seq(100)], 10).depths == (3,)  # no table: K


def test_where_the_planner_says_no_draft_pays_the_pin_does_not_force_a_step():
    policy = controlled("auto", _table([10, 20, 30, 40], 0.1), pin_tokens=8)
    policy.controller.budget.share = 0.0  # no allowance: exploration cannot run either
    assert step(policy, [seq(0)]) == (GateStep.PLAIN, False)
    assert policy.next_is_plain([seq(0)])
    paying = controlled("auto", _table([10, 11, 12, 13], 0.9), pin_tokens=8)
    assert step(paying, [seq(0)]) == (GateStep.MTP, False)  # speculation on its merits: nothing pinned
    assert not paying.next_is_plain([seq(0)])


def test_a_step_never_explores_over_a_lookahead_in_flight():
    policy = controlled("auto", _table([10, 12, 14, 16], 0.1), pin_tokens=8)
    for _ in range(300):
        policy.controller.record_plain(1, 10.0, 0.1)  # an allowance saved up
    s = seq(100)
    assert policy.choose([s], 10, ahead=True).step is GateStep.PLAIN  # exploring would drop that step
    assert not policy.next_is_plain([s])  # so the step before an exploration starts no lookahead
    assert policy.choose([s], 10, ahead=False).exploring


def test_suppress_tool_call_keeps_a_sequence_inside_a_call_plain():
    from runtime.content_phase import PhaseTracker

    inside, outside = seq(100), seq(100)
    inside.content, outside.content = PhaseTracker(), PhaseTracker()
    inside.content.advance('Sure. <tool_call>{"name": "f"')
    outside.content.advance('<tool_call>{"name": "f"}</tool_call> done')
    suppressing = SpeculationPolicy("ngram", 3, "force", suppress_tool_call=True)
    assert not suppressing.eligible(inside) and suppressing.eligible(outside)
    assert SpeculationPolicy("ngram", 3, "force").eligible(inside)  # off by default


def test_no_sequence_drafts_before_plain_decode_is_measured():
    """Speculative cells are learned as ratios to plain decode: until a few plain steps are measured,
    every step is plain (a first spell would be read against the prior's plain cost)."""
    table = _table([10, 11, 12, 13], 0.9)
    controller = OnlineController(OnlineCostModel(table, "test"), max_k=3, slack=0.1, mtp_max_seqs=32)
    policy = SpeculationPolicy("ngram", 3, "auto", controller=controller)
    for _ in range(PLAIN_FIRST):
        assert policy.choose([seq(100)], 10).step is GateStep.PLAIN
        controller.costs.observe("verify", 1, 0, 10.0, 0.1)
    assert policy.choose([seq(100)], 10).step is GateStep.MTP
