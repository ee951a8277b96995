"""BLAS selection: the faster library by measurement, kept per machine, never a crash."""

import json

import pytest

from runtime import blas


@pytest.fixture
def verdict(tmp_path, monkeypatch):
    path = tmp_path / "metrale-blas.json"
    monkeypatch.setattr(blas, "VERDICT", path)
    return path


def fake_probe(times, calls):
    def probe(path):
        calls.append(path)
        return times[path]
    return probe


def test_the_faster_library_is_chosen_and_the_verdict_kept(verdict, monkeypatch):
    calls = []
    monkeypatch.setattr(blas, "probe", fake_probe({"/a.so": 30.0, "/b.so": 50.0}, calls))
    found = {"mkl": "/a.so", "openblas": "/b.so"}
    assert blas.measured_choice(found)[0] == "mkl"
    assert len(calls) == 4  # two interleaved passes
    assert json.loads(verdict.read_text())["chosen"] == "mkl"
    monkeypatch.setattr(blas, "probe", fake_probe({"/a.so": 90.0, "/b.so": 50.0}, calls))
    name, why = blas.measured_choice(found)
    assert name == "mkl" and len(calls) == 4 and "mkl 30.0 ms" in why  # same machine: not timed again


def test_another_machine_measures_again(verdict, monkeypatch):
    calls = []
    monkeypatch.setattr(blas, "probe", fake_probe({"/a.so": 30.0, "/b.so": 50.0}, calls))
    found = {"mkl": "/a.so", "openblas": "/b.so"}
    blas.measured_choice(found)
    saved = json.loads(verdict.read_text())
    verdict.write_text(json.dumps({**saved, "key": "another machine"}))
    monkeypatch.setattr(blas, "probe", fake_probe({"/a.so": 80.0, "/b.so": 50.0}, calls))
    assert blas.measured_choice(found)[0] == "openblas" and len(calls) == 8


def test_a_library_that_fails_its_probe_is_not_chosen(verdict, monkeypatch):
    monkeypatch.setattr(blas, "probe", fake_probe({"/a.so": None, "/b.so": 50.0}, []))
    assert blas.measured_choice({"mkl": "/a.so", "openblas": "/b.so"})[0] == "openblas"
    monkeypatch.setattr(blas, "probe", fake_probe({"/a.so": None, "/b.so": None}, []))
    verdict.unlink()
    assert blas.measured_choice({"mkl": "/a.so", "openblas": "/b.so"})[0] is None


def test_a_real_probe_times_each_library_present_and_fails_cleanly_on_a_broken_one(tmp_path):
    for path in blas.candidates().values():
        assert 0 < blas.probe(path) < 10_000
    broken = tmp_path / "libbroken.so"
    broken.write_bytes(b"not a library")
    assert blas.probe(str(broken)) is None


def test_this_process_runs_on_a_tuned_blas_and_an_unknown_choice_is_refused():
    import kernels

    if blas.candidates():
        assert kernels.BLAS.split(" ")[0] in ("mkl", "openblas")
    with pytest.raises(ValueError, match="blas must be one of"):
        blas._selected, saved = None, blas._selected
        try:
            blas.select_blas("fastest")
        finally:
            blas._selected = saved
