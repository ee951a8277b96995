"""metrale calibrate on a tiny random model: every cell measured, the declared energy source, the
acceptance fit, refusing another model's or machine's table, and nothing written when interrupted."""

from __future__ import annotations

import itertools
import json

import mlx.core as mx
import pytest

import runtime.calibrate as cal
from kernels.loader import load
from kernels.mtp_head import MTPConfig, MTPHead, save_mtp_head
from runtime.cost_table import load_table, machine_id, save_table
from runtime.energy import open_meter
from runtime.sequence import StepRecord as Step
from tests.tiny import save_tiny_dir

SETTINGS = cal.Settings(widths=(1, 2), max_k=3, warmup=1, repeats=2, prompts=1, max_tokens=12)
PATTERN = [5, 9, 13, 17, 21, 25]
WORKLOAD = cal.Workload(
    context=tuple(range(1, 17)),
    history=tuple(PATTERN * 40),
    prompts=(tuple(PATTERN * 3), tuple(range(30, 50))),
)


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory):
    """The tiny model as a model directory: the acceptance run serves it through the actor system."""
    return save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=4)


@pytest.fixture(scope="module")
def model(served_dir):
    return load(served_dir).model  # the same weights, timed in this thread


def measure(model, served_dir, drafter="ngram", **kw):
    return cal.measure_table(model, model_dir=served_dir, drafter=drafter, model_name="tiny", dtype="float32",
                             settings=SETTINGS, workload=WORKLOAD, **kw)


def test_the_table_has_every_cell_and_declares_its_energy_source(table, tmp_path):
    depths = tuple(range(SETTINGS.max_k + 1))
    assert table.widths == SETTINGS.widths and table.depths == depths
    assert all(c.ms > 0 and c.joules > 0 for row in table.verify for c in row)
    assert all(row[0].ms == 0 and all(c.ms > 0 for c in row[1:]) for row in table.draft)
    assert table.meta.energy_source == open_meter(SETTINGS.watts_per_core).source
    assert table.meta.machine == machine_id() and table.meta.model_id == "tiny"
    assert (table.meta.watts_per_core is not None) == (table.meta.energy_source == "cpu_proxy")
    assert len(table.calibration.by_depth) == SETTINGS.max_k
    assert table.calibration.confidence == ()  # n-gram drafts carry no confidence
    save_table(table, tmp_path / "t.json")
    assert load_table(tmp_path / "t.json", expect_model="tiny", expect_machine=machine_id()) == table


@pytest.fixture(scope="module")
def mtp_table(model, served_dir, tmp_path_factory):
    config = MTPConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128)
    mx.random.seed(1)
    head = MTPHead(config)
    mx.eval(head.parameters())
    folder = save_mtp_head(head, tmp_path_factory.mktemp("head"))
    return measure(model, served_dir, drafter="mtp", head=head, mtp_head=str(folder))


def test_an_mtp_drafter_gets_draft_cells_and_acceptance(mtp_table):
    assert all(c.ms > 0 for row in mtp_table.draft for c in row[1:])
    assert len(mtp_table.calibration.by_depth) == SETTINGS.max_k


def test_an_mtp_drafter_gets_confidence_knots(mtp_table):
    knots = mtp_table.calibration.confidence
    assert knots and all(a < b for a, b in zip(knots, knots[1:]))


def test_acceptance_by_depth_is_conditional_on_the_accepted_prefix():
    steps = [Step((), 3, 3), Step((), 3, 1), Step((), 3, 0), Step((), 2, 2)]
    # depth 1: 4 tries, 3 hits; depth 2: 3 tries (prefix accepted), 2 hits; depth 3: 1 try, 1 hit;
    # past depth 1, two pseudo-trials at the previous depth's rate; depth 4 was never tried.
    d2 = (2 + 2 * 0.75) / (3 + 2)
    d3 = (1 + 2 * d2) / (1 + 2)
    assert cal.fit_calibration(steps, max_k=4).by_depth == pytest.approx((0.75, d2, d3, d3))
    assert cal.fit_calibration([], max_k=4).by_depth == ()


def test_confidence_knots_ascend_and_map_to_observed_acceptance():
    steps = [Step((-0.1,), 1, 1)] * 6 + [Step((-3.0,), 1, 0)] * 6 + [Step((-0.1,), 1, 0)] * 2
    fit = cal.fit_calibration(steps, max_k=1, bins=4)
    assert all(a < b for a, b in zip(fit.confidence, fit.confidence[1:]))
    assert fit.p_accept(-3.0) == 0.0 and fit.p_accept(-0.1) == pytest.approx(0.75)


def other(table, **meta):
    from msgspec import structs

    return structs.replace(table, meta=structs.replace(table.meta, **meta))


@pytest.fixture(scope="module")
def table(model, served_dir):
    return measure(model, served_dir)


@pytest.mark.parametrize("field", ["model_id", "machine"])
def test_a_table_of_another_model_or_machine_is_refused(table, tmp_path, field):
    path = tmp_path / "t.json"
    save_table(other(table, **{field: "elsewhere"}), path)
    with pytest.raises(cal.CalibrateError, match="elsewhere.*--force"):
        cal.check_target(path, "tiny", machine_id(), force=False)
    cal.check_target(path, "tiny", machine_id(), force=True)
    save_table(table, path)
    cal.check_target(path, "tiny", machine_id(), force=False)  # same model and machine: fine
    path.write_text("not json")
    with pytest.raises(cal.CalibrateError, match="not a cost table"):
        cal.check_target(path, "tiny", machine_id(), force=False)


def model_dir(tmp_path, name="tiny"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def test_the_command_refuses_before_measuring(table, tmp_path, capsys, monkeypatch):
    out = tmp_path / "t.json"
    save_table(other(table, machine="elsewhere"), out)
    before = out.read_bytes()
    monkeypatch.setattr(cal, "_measure", lambda *a: pytest.fail("measured before refusing"))
    argv = ["--model", str(model_dir(tmp_path)), "--drafter", "ngram", "--out", str(out)]
    assert cal.main(argv) == 2
    assert "elsewhere" in capsys.readouterr().err and out.read_bytes() == before


def test_an_interrupted_run_writes_nothing(model, served_dir, tmp_path, capsys, monkeypatch):
    calls = itertools.count()

    def tick():
        if next(calls) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(cal, "_measure", lambda *a: measure(model, served_dir, tick=tick))
    out = tmp_path / "calibration" / "t.json"
    argv = ["--model", str(model_dir(tmp_path)), "--drafter", "ngram", "--out", str(out)]
    assert cal.main(argv) == 130
    assert "interrupted; no table written" in capsys.readouterr().err
    assert not out.exists() and not out.parent.exists()


def test_paths_and_widths():
    assert cal.powers_of_two(32) == (1, 2, 4, 8, 16, 32) and cal.powers_of_two(12) == (1, 2, 4, 8)
    assert cal.model_id("/x/SmolLM2-135M-Instruct-f32") == "SmolLM2-135M-Instruct"
    assert cal.table_name("SmolLM2-135M-Instruct", "ngram") == "smollm2-135m-instruct-ngram.json"
    assert cal.table_path("M", "mtp", str("/c")).as_posix() == "/c/calibration/m-mtp.json"
