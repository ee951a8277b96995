"""metrale bench planner's comparison logic on a synthetic table (no model), and its sweep through
the served actor system on a tiny random model."""

from __future__ import annotations

import pytest

from runtime.bench.planner import PLANNER, Bench, Totals, choose_depth, compare, report
from runtime.cost_table import AcceptanceCalibration, Cost, TableMeta, make_table
from runtime.plan import expected_tokens

META = TableMeta(model_id="m", drafter="ngram", machine="x", dtype="float32", blas="openblas",
                 energy_source="cpu_proxy", watts_per_core=10.0, date="2026-11-29T00:00:00+00:00")
# DESIGN.md's measured verify costs on this machine: 1.14x / 1.19x / 1.31x / 1.50x a plain step.
VERIFY_MS = {0: 58.0, 1: 66.1, 2: 69.0, 3: 72.0, 4: 76.0, 5: 79.0, 6: 82.0, 7: 85.0, 8: 87.0}
PRIOR = (0.6, 0.5, 0.4, 0.3, 0.3, 0.3, 0.3, 0.3)


def synthetic_table(prior=PRIOR):
    return make_table(
        meta=META, widths=(1,), depths=tuple(VERIFY_MS),
        verify=lambda n, k: Cost(ms=VERIFY_MS[k], joules=VERIFY_MS[k] / 50),
        draft=lambda n, k: Cost(ms=0.02 * k, joules=0.0004 * k),
        calibration=AcceptanceCalibration(by_depth=prior),
    )


def expected_totals(table, planner_k, steps=100):
    """What the bench would measure if the machine behaved exactly as the table says."""
    totals = {}
    for k in table.depths:
        cost = table.step_cost(1, k)
        tokens = round(steps * expected_tokens(table.calibration.by_depth[:k]))
        totals[k] = Totals(tokens, steps * cost.ms / 1e3, steps * cost.joules)
    return totals


def test_the_planner_on_its_own_table_matches_the_oracle():
    table = synthetic_table()
    choice = choose_depth(table, n=1, slack=0.1, max_k=8, mtp_max_seqs=32)
    verdict = compare(expected_totals(table, choice.depth), choice.depth, slack=0.1)
    assert choice.depth == verdict.oracle_k > 0
    assert verdict.tpj_ratio == pytest.approx(1.0) and verdict.passed
    assert "PASS" in report("code", 1, expected_totals(table, choice.depth), verdict)


def test_over_the_cap_the_planner_does_not_draft():
    choice = choose_depth(synthetic_table(), n=64, slack=0.1, max_k=8, mtp_max_seqs=32)
    assert (choice.depth, choice.reason) == (0, "over_cap")


def test_a_planner_k_trailing_the_oracle_by_more_than_five_percent_fails():
    totals = {0: Totals(100, 10.0, 100.0), 2: Totals(100, 10.0, 94.0), 3: Totals(100, 10.0, 94.0)}
    verdict = compare(totals, 0, slack=0.1)
    assert verdict.oracle_k == 2  # the tie with K=3 keeps the shallower K
    assert verdict.tpj_ratio == pytest.approx(0.94) and not verdict.passed
    assert "FAIL" in report("chat", 1, totals, verdict) and verdict.served_tpj_ratio is None


def test_the_planner_as_served_is_reported_beside_its_k():
    totals = {0: Totals(100, 10.0, 100.0), 1: Totals(120, 10.0, 100.0), PLANNER: Totals(120, 10.0, 120.0)}
    verdict = compare(totals, 1, slack=0.1)
    assert (verdict.oracle_k, verdict.tpj_ratio, verdict.served_tpj_ratio) == (1, 1.0, 1 / 1.2)
    assert "as served: 0.833" in report("code", 1, totals, verdict)


def test_a_planner_k_within_tpj_but_slower_than_the_slack_fails():
    totals = {0: Totals(100, 5.0, 100.0), 1: Totals(100, 8.0, 100.0)}
    verdict = compare(totals, 1, slack=0.1)
    assert verdict.oracle_k == 0  # equal tokens per joule: the tie keeps the shallower K
    assert verdict.tpj_ratio == 1.0 and verdict.tps_ratio == pytest.approx(0.625) and not verdict.passed
    assert compare(totals, 1, slack=0.5).passed


def test_totals_add_up_by_position():
    t = Totals()
    t.add(10, 1.0, 2.0, [3, 2], [2, 1])
    t.add(5, 1.0, 3.0, [1, 1, 1], [1, 0, 0])
    assert (t.tokens, t.tok_s, t.tok_j) == (15, 7.5, 3.0)
    assert (t.drafted, t.accepted) == ([4, 3, 1], [3, 1, 0])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.tiny import save_tiny_dir

    return save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=5)


@pytest.mark.parametrize("width", [1, 3])
async def test_every_configuration_decodes_plain_decodes_tokens_through_the_served_system(tiny_dir, width):
    from msgspec import structs

    from runtime.cost_table import machine_id
    from runtime.energy import CpuProxyMeter

    table = synthetic_table()
    table = structs.replace(table, meta=structs.replace(table.meta, model_id="tiny", machine=machine_id()))
    bench = Bench(tiny_dir, "ngram", table, CpuProxyMeter(10.0), max_k=4, slack=0.1, mtp_max_seqs=32,
                  max_tokens=20)
    prompts = [[7, 8, 9, 10] * 6, [3, 4, 5] * 5, [11, 12] * 9][:width]
    totals, mismatches = (await bench.sweep({"ids": [prompts]}, width))["ids"]
    assert list(totals) == [0, 1, 2, 3, 4, PLANNER] and mismatches == 0
    assert all(t.tokens == 19 * width and t.seconds > 0 and t.joules > 0 for t in totals.values())
    assert sum(totals[0].drafted) == 0 and sum(totals[4].drafted) > 0 and len(totals[2].drafted) == 2
    assert len(totals[PLANNER].drafted) <= 4
