"""A self-calibration call that ran short of CPU (other work shared the cores) is timed again, up to
one drop per call of the queue: a machine busy throughout is measured as it is."""

from hypothesis import given, settings, strategies as st

from runtime.cost_table import TableMeta
from runtime.self_calibration import STARVED, SelfCalibration

META = TableMeta(model_id="m", drafter="mtp", machine="this cpu", dtype="float32", blas="openblas",
                 energy_source="cpu_proxy", watts_per_core=10.0, date="")


def test_a_call_short_of_cpu_is_not_taken_and_its_cell_stays_due():
    check = SelfCalibration(META, max_k=1, widths=(1,), checks=True)
    plain = check.next_cell()
    for _ in range(3):  # plain, verify at depth 1, its draft: two cores busy, 1.9 CPU ms per wall ms
        assert check.record(check.next_cell(), 30.0, 0.5, cpu_ms=57.0)
    assert check.next_cell() == plain
    assert not check.record(plain, 45.0, 0.5, cpu_ms=57.0)  # the same work with a core taken away: 1.27
    assert check.next_cell() == plain and check.starved == 1 and len(check.samples[plain]) == 1
    assert check.record(plain, 31.0, 0.5, cpu_ms=58.0)
    assert check.samples[plain][-1] == (31.0, 0.5)
    assert check.snapshot()["timed_again_short_of_cpu"] == 1


def test_calls_without_a_cpu_reading_are_all_taken():
    check = SelfCalibration(META, max_k=1, widths=(1,), checks=True)
    while not check.done:
        assert check.record(check.next_cell(), 30.0, 0.5)
    assert check.starved == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.2, max_value=2.0), min_size=1, max_size=400))
def test_drops_are_bounded_and_every_taken_call_had_its_cells_cpu(shares):
    """Whatever CPU the calls get, the check ends after at most twice its calls, and a call is taken
    short of CPU only once the drops have run out."""
    check = SelfCalibration(META, max_k=2, widths=(1, 2), checks=True)
    best: dict = {}
    calls = 0
    while not check.done:
        cell, share = check.next_cell(), shares[calls % len(shares)]
        starved_before = check.starved
        taken = check.record(cell, 30.0, 0.5, cpu_ms=30.0 * share)
        calls += 1
        if taken:
            assert share >= STARVED * best.get(cell, 0.0) or starved_before >= check.total
        else:
            assert check.starved == starved_before + 1
        best[cell] = max(best.get(cell, 0.0), share)
        assert calls <= 2 * check.total
    assert check.starved <= check.total
