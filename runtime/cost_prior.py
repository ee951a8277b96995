"""Where the online cost model starts, and where what it learned is kept.

The best prior at hand, in order: the cache folder's table for this model and drafter (what this
server learned before, or `metrale calibrate` measured), then the table shipped in
configs/calibration/. A table measured on another machine is a prior to correct, never a refusal:
its shape (how verify cost grows with depth and width) carries over, and served steps fix its
scale within a minute. The learned table goes to the cache folder, atomically, in the format
`metrale calibrate` writes; deleting that file resets what was learned.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from runtime.cost_table import CostTable, CostTableError, TableMeta, load_table, save_table
from runtime.online_cost import CACHED, OnlineCostModel
from runtime.self_calibration import SELF_CALIBRATED


def prior_tables(model: str, drafter: str, cache: str | None, first: Path | None = None) -> list[tuple[Path, str]]:
    """Candidate tables, best first, with the origin each would have if native; `first` (a
    distributed group's own learned table) before them."""
    from runtime.calibrate import SHIPPED_DIR, table_name, table_path

    found = [(table_path(model, drafter, cache), CACHED), (SHIPPED_DIR / table_name(model, drafter), "shipped")]
    return ([(first, CACHED)] if first is not None else []) + found


def load_prior(model: str, drafter: str, cache: str | None, machine: str, log,
               blas: str | None = None, first: Path | None = None) -> tuple[CostTable, str] | None:
    """The first readable table and its origin ("cache", "shipped", or "foreign-..." when measured
    on another machine or, given `blas`, with another BLAS); None when there is none."""
    for path, origin in prior_tables(model, drafter, cache, first):
        if not path.exists():
            continue
        try:
            table = load_table(path, expect_model=model)
        except CostTableError as e:
            log.warning("cost_table_unusable", path=str(path), reason=str(e))
            continue
        native = table.meta.machine == machine and (blas is None or same_blas(table.meta.blas, blas))
        source = origin if native else f"foreign-{origin}"
        log.info("cost_prior_loaded", path=str(path), source=source, measured_on=table.meta.machine,
                 widths=list(table.widths), depths=list(table.depths))
        return table, source
    return None


def same_blas(a: str, b: str) -> bool:
    """Same library ("mkl (path; why) | rows kernel" vs "mkl") and the same kernel for few rows:
    either changed prices steps differently."""
    return a.split(" ", 1)[0] == b.split(" ", 1)[0] and ("| rows kernel" in a) == ("| rows kernel" in b)


def save_learned(costs: OnlineCostModel, path: Path, *, machine: str, blas: str, energy_source: str, log) -> None:
    """Write the corrected table for the next start (atomic; nothing when nothing new was measured)."""
    if not costs.observations and costs.source != SELF_CALIBRATED:
        return
    meta = costs.prior.meta
    meta = TableMeta(model_id=meta.model_id, drafter=meta.drafter, machine=machine, dtype=meta.dtype, blas=blas,
                     energy_source=energy_source, watts_per_core=meta.watts_per_core,
                     date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    try:
        save_table(costs.learned_table(meta), path)
    except (OSError, CostTableError) as e:
        log.warning("cost_table_not_saved", path=str(path), reason=str(e))
        return
    log.info("cost_table_saved", path=str(path), observations=costs.observations)
