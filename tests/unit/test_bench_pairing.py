"""bench verify's ratios pair each repeat's calls: a machine whose speed drifts between repeats
moves both calls of a repeat alike, so the paired median keeps the true ratio."""

import statistics

from hypothesis import given, strategies as st

from runtime.bench.verify import paired_median


@given(st.lists(st.floats(0.5, 2.0), min_size=3, max_size=15), st.floats(1.0, 1.6))
def test_a_drift_shared_by_both_calls_of_a_repeat_leaves_the_ratio(speeds, true_ratio):
    plain = [40.0 * s for s in speeds]
    verify = [p * true_ratio for p in plain]
    assert abs(paired_median(verify, plain) - true_ratio) < 1e-9


def test_medians_of_each_path_alone_carry_the_drift_that_pairing_removes():
    plain = [40.0, 40.0, 60.0, 60.0, 60.0]  # the machine slowed between the repeats
    verify = [48.0, 48.0, 72.0, 72.0, 72.0]
    verify_unpaired = [48.0, 48.0, 48.0, 72.0, 72.0]  # the same calls, at other moments
    assert statistics.median(verify_unpaired) / statistics.median(plain) == 0.8
    assert paired_median(verify, plain) == 1.2


def test_unequal_repeat_counts_are_an_error():
    import pytest

    with pytest.raises(ValueError):
        paired_median([1.0, 2.0], [1.0])
