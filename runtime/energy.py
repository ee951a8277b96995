"""Energy meters for calibration: joules spent since the meter was opened, and where they came from.

Sources, best first:
- "rapl": Linux powercap (/sys/class/powercap/intel-rapl:N/energy_uj), one counter per CPU package,
  in microjoules. A counter wraps to 0 past max_energy_range_uj, so a reading that went down adds
  the range: delta = (now - before) mod range. Two wraps between reads cannot be told from one, so
  read at least every few minutes (the range is ~262 kJ: over an hour at 70 W). Often root-only.
- "cpu_proxy": where no counter is readable (these CI machines have none): the process's
  CPU-seconds (all threads, BLAS included) times a configured watts-per-core. It leaves out idle,
  uncore and DRAM power: it ranks work by CPU time rather than metering the socket; tables say so.

powermetrics / IOReport (macOS) are not read here yet; on macOS the proxy is used.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Literal, Protocol, Sequence

import msgspec

EnergySource = Literal["rapl", "cpu_proxy"]

POWERCAP_ROOT = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"intel-rapl:\d+")  # packages only: their sub-zones are inside them


class EnergyReading(msgspec.Struct, frozen=True, kw_only=True):
    joules: float  # cumulative since the meter was opened
    source: EnergySource

    def since(self, earlier: EnergyReading) -> float:
        """Joules spent between an earlier reading of the same meter and this one."""
        if earlier.source != self.source:
            raise ValueError(f"readings from different sources: {earlier.source}, {self.source}")
        return self.joules - earlier.joules


class EnergyMeter(Protocol):
    @property
    def source(self) -> EnergySource: ...

    def read(self) -> EnergyReading: ...


class RaplMeter:
    """Sums the package counters, unwrapping each. Not thread-safe: one reader."""

    def __init__(self, zones: Sequence[Path]) -> None:
        if not zones:
            raise ValueError("RaplMeter needs at least one powercap zone")
        self._zones = tuple(zones)
        self._ranges = tuple(_read_int(z / "max_energy_range_uj") for z in self._zones)
        self._last = [_read_int(z / "energy_uj") for z in self._zones]
        self._total_uj = 0

    @property
    def source(self) -> EnergySource:
        return "rapl"

    def read(self) -> EnergyReading:
        for i, zone in enumerate(self._zones):
            now = _read_int(zone / "energy_uj")
            self._total_uj += (now - self._last[i]) % self._ranges[i]
            self._last[i] = now
        return EnergyReading(joules=self._total_uj / 1e6, source="rapl")


class CpuProxyMeter:
    """CPU-seconds of this process times watts_per_core (see the module doc)."""

    def __init__(
        self, watts_per_core: float, cpu_seconds: Callable[[], float] = time.process_time
    ) -> None:
        if not watts_per_core > 0:
            raise ValueError(f"watts_per_core must be positive, got {watts_per_core}")
        self.watts_per_core = watts_per_core
        self._cpu_seconds = cpu_seconds
        self._start = cpu_seconds()

    @property
    def source(self) -> EnergySource:
        return "cpu_proxy"

    def read(self) -> EnergyReading:
        spent = self._cpu_seconds() - self._start
        return EnergyReading(joules=spent * self.watts_per_core, source="cpu_proxy")


def rapl_zones(root: Path = POWERCAP_ROOT) -> tuple[Path, ...]:
    """The package zones under root whose counter and range this process can read."""
    try:
        candidates = sorted(p for p in root.glob("intel-rapl*") if _PACKAGE_ZONE.fullmatch(p.name))
    except OSError:
        return ()
    return tuple(z for z in candidates if _readable(z))


def open_meter(
    watts_per_core: float,
    *,
    powercap_root: Path = POWERCAP_ROOT,
    cpu_seconds: Callable[[], float] = time.process_time,
) -> EnergyMeter:
    """RAPL where readable, else the CPU-seconds proxy."""
    zones = rapl_zones(powercap_root)
    if zones:
        return RaplMeter(zones)
    return CpuProxyMeter(watts_per_core, cpu_seconds)


def _readable(zone: Path) -> bool:
    try:
        return _read_int(zone / "max_energy_range_uj") > 0 and _read_int(zone / "energy_uj") >= 0
    except (OSError, ValueError):
        return False


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())
