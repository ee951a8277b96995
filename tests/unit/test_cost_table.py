"""The calibration table: its checks, its interpolation, its refusal of another model or machine."""

from __future__ import annotations

import json
import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.cost_table import (
    SCHEMA_VERSION,
    AcceptanceCalibration,
    Cost,
    TableFormatError,
    TableMeta,
    TableMismatchError,
    TableNotFoundError,
    load_table,
    machine_id,
    make_table,
    save_table,
)

META = TableMeta(
    model_id="smollm2-135m-instruct",
    drafter="ngram",
    machine="Linux-x86_64 | Test CPU | 2 cpus",
    dtype="float32",
    blas="openblas",
    energy_source="cpu_proxy",
    watts_per_core=10.0,
    date="2026-11-29T00:00:00+00:00",
)


def grid_table(ms=lambda n, k: 50.0 + 10 * n + 5 * k, widths=(1, 2, 4), depths=(0, 1, 2, 3)):
    """Verify joules are ms / 100; drafting costs 2 ms (0.02 J) per draft."""
    return make_table(
        meta=META,
        widths=widths,
        depths=depths,
        verify=lambda n, k: Cost(ms=ms(n, k), joules=ms(n, k) / 100),
        draft=lambda n, k: Cost(ms=2.0 * k, joules=0.02 * k),
        calibration=AcceptanceCalibration(
            confidence=(-2.0, -0.5), acceptance=(0.2, 0.8), by_depth=(0.7, 0.6)
        ),
    )


def test_save_then_load_gives_the_same_table(tmp_path):
    path = tmp_path / "tables" / "model.json"
    save_table(grid_table(), path)
    assert load_table(path, expect_model=META.model_id, expect_machine=META.machine) == grid_table()
    assert list(path.parent.iterdir()) == [path]  # the temporary file was renamed into place


def test_the_json_names_its_metadata_and_cells(tmp_path):
    path = tmp_path / "t.json"
    save_table(grid_table(), path)
    doc = json.loads(path.read_text())
    assert set(doc) == {"meta", "widths", "depths", "verify", "draft", "calibration"}
    assert doc["meta"]["schema_version"] == SCHEMA_VERSION
    assert doc["meta"]["energy_source"] == "cpu_proxy"
    assert doc["verify"][1][2] == {"ms": 80.0, "joules": 0.8}  # width 2, depth 2


@pytest.mark.parametrize("field, kwargs", [
    ("model", {"expect_model": "llama-3-8b"}),
    ("machine", {"expect_machine": "Darwin-arm64 | Apple M4 | 10 cpus"}),
])
def test_a_table_for_another_model_or_machine_is_refused(tmp_path, field, kwargs):
    path = tmp_path / "t.json"
    save_table(grid_table(), path)
    with pytest.raises(TableMismatchError, match="run `metrale calibrate`") as info:
        load_table(path, **kwargs)
    assert info.value.field == field
    assert info.value.found in (META.model_id, META.machine)


def test_a_missing_table_says_how_to_make_one(tmp_path):
    with pytest.raises(TableNotFoundError, match="metrale calibrate"):
        load_table(tmp_path / "absent.json")


def test_garbage_and_other_schema_versions_are_format_errors(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with pytest.raises(TableFormatError):
        load_table(path)
    save_table(grid_table(), path)
    doc = json.loads(path.read_text())
    doc["meta"]["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(doc))
    with pytest.raises(TableFormatError, match="schema version"):
        load_table(path)


@pytest.mark.parametrize("broken", [
    dict(depths=(1, 2, 3, 4)),  # no plain step
    dict(widths=(2, 1, 4)),
    dict(verify=((Cost(ms=1.0, joules=1.0),),) * 3),  # wrong shape
    dict(verify=tuple(tuple(Cost(ms=0.0, joules=1.0) for _ in range(4)) for _ in range(3))),
    dict(draft=tuple(tuple(Cost(ms=math.nan, joules=0.0) for _ in range(4)) for _ in range(3))),
    dict(calibration=AcceptanceCalibration(confidence=(-1.0, -2.0), acceptance=(0.5, 0.6))),
    dict(calibration=AcceptanceCalibration(by_depth=(1.5,))),
])
def test_invalid_tables_are_not_saved(tmp_path, broken):
    table = msgspec.structs.replace(grid_table(), **broken)
    with pytest.raises(TableFormatError):
        save_table(table, tmp_path / "t.json")


def test_measured_cells_are_returned_exactly():
    table = grid_table()
    assert table.verify_cost(2, 3) == Cost(ms=85.0, joules=0.85)
    assert table.step_cost(4, 1) == Cost(ms=95.0 + 2.0, joules=0.95 + 0.02)
    assert table.verify_row(1) == tuple(Cost(ms=60.0 + 5 * k, joules=(60.0 + 5 * k) / 100)
                                        for k in range(4))


def test_cost_is_linear_between_depths_and_widths():
    table = grid_table()
    assert table.verify_cost(1, 1.5).ms == pytest.approx(67.5)  # R / n = 3 / 2
    assert table.verify_cost(3, 2).ms == pytest.approx(90.0)  # halfway from width 2 to 4


def test_a_non_monotone_grid_is_kept_as_measured():
    table = grid_table(ms=lambda n, k: {0: 50.0, 1: 55.0, 2: 70.0, 3: 60.0}[k])
    assert table.verify_cost(1, 3).ms < table.verify_cost(1, 2).ms
    assert table.verify_cost(1, 2.5).ms == pytest.approx(65.0)


def test_past_the_last_point_cost_rises_along_the_last_slope_and_never_falls():
    rising = grid_table()
    assert rising.verify_cost(1, 5).ms == pytest.approx(85.0)
    assert rising.verify_cost(8, 0).ms == pytest.approx(130.0)
    assert rising.verify_cost(1, 0).ms == rising.verify_cost(0, 0).ms  # flat below the first
    falling = grid_table(ms=lambda n, k: {0: 50.0, 1: 55.0, 2: 70.0, 3: 60.0}[k])
    assert falling.verify_cost(1, 6).ms == 60.0


@settings(max_examples=200, deadline=None)
@given(
    cells=st.lists(st.floats(0.5, 500.0), min_size=4, max_size=4),
    depth=st.floats(0.0, 3.0),
)
def test_interpolated_cost_lies_between_its_neighbours(cells, depth):
    table = grid_table(ms=lambda n, k: cells[k])
    low, high = math.floor(depth), math.ceil(depth)
    value = table.verify_cost(1, depth).ms
    assert min(cells[low], cells[high]) - 1e-9 <= value <= max(cells[low], cells[high]) + 1e-9


def test_the_default_calibration_is_exp_of_the_log_probability():
    default = AcceptanceCalibration()
    assert default.p_accept(math.log(0.25)) == pytest.approx(0.25)
    assert default.p_accept(0.0) == 1.0


def test_a_measured_calibration_interpolates_between_bins_and_is_flat_beyond():
    cal = AcceptanceCalibration(confidence=(-2.0, -0.5), acceptance=(0.2, 0.8))
    assert cal.p_accept(-1.25) == pytest.approx(0.5)
    assert cal.p_accept(-9.0) == 0.2
    assert cal.p_accept(0.0) == 0.8


def test_machine_id_names_os_cpu_model_and_cores(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t: avx2\n")
    ident = machine_id(cpuinfo)
    assert "Test CPU 9000" in ident and "cpus" in ident
    assert ident == machine_id(cpuinfo)
    assert machine_id(tmp_path / "absent")  # falls back to what platform knows
