"""Energy meters: RAPL counters (with wrap-around) where readable, else the CPU-seconds proxy."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.energy import CpuProxyMeter, EnergyReading, RaplMeter, open_meter, rapl_zones

RANGE_UJ = 262_143_328_850


def fake_zone(root: Path, name: str, energy_uj: int, range_uj: int = RANGE_UJ) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return zone


def set_energy(zone: Path, energy_uj: int) -> None:
    (zone / "energy_uj").write_text(f"{energy_uj}\n")


class FakeCpuClock:
    def __init__(self) -> None:
        self.seconds = 100.0

    def __call__(self) -> float:
        return self.seconds


def test_rapl_sums_package_counters_since_opening(tmp_path):
    pkg0 = fake_zone(tmp_path, "intel-rapl:0", 5_000_000)
    pkg1 = fake_zone(tmp_path, "intel-rapl:1", 9_000_000)
    meter = RaplMeter(rapl_zones(tmp_path))
    assert meter.read() == EnergyReading(joules=0.0, source="rapl")
    set_energy(pkg0, 6_500_000)
    set_energy(pkg1, 9_250_000)
    assert meter.read() == EnergyReading(joules=1.75, source="rapl")


def test_rapl_unwraps_a_counter_that_passed_its_range(tmp_path):
    zone = fake_zone(tmp_path, "intel-rapl:0", 999_000_000, range_uj=1_000_000_000)
    meter = RaplMeter([zone])
    set_energy(zone, 2_000_000)  # wrapped: 1 J to the top, then 2 J more
    assert meter.read().joules == pytest.approx(3.0)
    set_energy(zone, 4_000_000)
    assert meter.read().joules == pytest.approx(5.0)


@settings(max_examples=100, deadline=None)
@given(start=st.integers(0, 999), steps=st.lists(st.integers(0, 999), max_size=20))
def test_rapl_total_is_the_sum_of_true_increments_whatever_the_wraps(
    tmp_path_factory, start, steps
):
    zone = fake_zone(tmp_path_factory.mktemp("powercap"), "intel-rapl:0", start, range_uj=1000)
    meter = RaplMeter([zone])
    counter = start
    for step in steps:  # each increment is under the range, so at most one wrap per read
        counter = (counter + step) % 1000
        set_energy(zone, counter)
        meter.read()
    assert meter.read().joules == pytest.approx(sum(steps) / 1e6)


def test_only_readable_package_zones_count(tmp_path):
    fake_zone(tmp_path, "intel-rapl:0", 1)
    fake_zone(tmp_path, "intel-rapl:0:0", 1)  # a sub-zone: already inside its package
    fake_zone(tmp_path, "intel-rapl-mmio:0", 1)  # a second view of the package
    unreadable = fake_zone(tmp_path, "intel-rapl:1", 1)
    (unreadable / "energy_uj").unlink()
    (unreadable / "energy_uj").mkdir()  # reading it fails, as a root-only file does
    assert rapl_zones(tmp_path) == (tmp_path / "intel-rapl:0",)


def test_the_proxy_is_cpu_seconds_times_watts_per_core():
    clock = FakeCpuClock()
    meter = CpuProxyMeter(watts_per_core=12.5, cpu_seconds=clock)
    start = meter.read()
    clock.seconds += 2.0  # e.g. two cores busy for one second
    end = meter.read()
    assert end == EnergyReading(joules=25.0, source="cpu_proxy")
    assert end.since(start) == 25.0


def test_the_proxy_needs_a_positive_wattage():
    with pytest.raises(ValueError):
        CpuProxyMeter(watts_per_core=0.0)


def test_open_meter_prefers_rapl_and_falls_back_to_the_proxy(tmp_path):
    assert open_meter(10.0, powercap_root=tmp_path / "absent").source == "cpu_proxy"
    assert open_meter(10.0, powercap_root=tmp_path).read().source == "cpu_proxy"
    fake_zone(tmp_path, "intel-rapl:0", 1)
    assert open_meter(10.0, powercap_root=tmp_path).read().source == "rapl"


def test_readings_from_different_sources_do_not_subtract():
    rapl = EnergyReading(joules=3.0, source="rapl")
    proxy = EnergyReading(joules=1.0, source="cpu_proxy")
    with pytest.raises(ValueError):
        rapl.since(proxy)


def test_the_real_proxy_counts_this_process_work():
    meter = CpuProxyMeter(watts_per_core=10.0)
    before = meter.read()
    sum(i * i for i in range(200_000))
    assert meter.read().since(before) > 0.0
