"""--plot of bench spec, batch and serve and of metrale replay, each drawn from small synthetic
results: the plotting functions take plain data, so no model runs here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")

from runtime.bench import batch, hyper, serve, spec  # noqa: E402
from runtime.replay import Choice, Delivered, Replay, StepResult  # noqa: E402
from runtime.replay_cli import plot as replay_plot  # noqa: E402

SPEC_LAST = "best_speedup_code=1.840 best_speedup_chat=1.210 median_speedup_code=1.790 median_speedup_chat=1.150"
BATCH_LAST = "min_ratio_off_vs_batchgen=0.910 min_ratio_on_vs_off=0.980 widths_lost_off_vs_batchgen=1 " \
             "widths_lost_on_vs_off=0"


def written(path) -> bool:
    """A PNG file, non-empty (the signature, then more than a blank canvas's worth of bytes)."""
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def keep(path) -> None:
    """METRALE_KEEP_PLOTS=DIR copies each PNG there, to look at."""
    if folder := os.environ.get("METRALE_KEEP_PLOTS"):
        (Path(folder) / path.name).write_bytes(path.read_bytes())


def test_spec_plot_draws_speedup_against_k(tmp_path):
    curves = {name: {"ngram": [(k, base + 0.1 * k, base + 0.08 * k) for k in (1, 2, 3, 4)],
                     "mtp": [(k, base + 0.3 * k - 0.05 * k * k, base + 0.25 * k - 0.05 * k * k) for k in (1, 2, 3, 4)]}
              for name, base in (("code", 1.0), ("chat", 0.9))}
    path = tmp_path / "spec.png"
    spec.plot(curves, SPEC_LAST, str(path))
    assert written(path)
    keep(path)


def test_spec_curve_takes_the_cells_of_one_drafter():
    def result(tokens, seconds):
        return SimpleNamespace(tokens=[0] * tokens, seconds=seconds)

    runs = {spec.PLAIN: [result(10, 1.0)], ("ngram", 1): [result(10, 0.5)], ("ngram", 2): [result(10, 0.25)]}
    assert spec.curve(runs) == [(1, 2.0, 2.0), (2, 4.0, 4.0)]


def test_batch_plot_draws_tok_s_and_ratios_against_clients(tmp_path):
    points = []
    for width in (1, 4, 8, 16):
        off, on = 10.0 * width ** 0.8, 12.0 * width ** 0.7
        points += [(width, "batchgen", 11.0 * width ** 0.8, None),
                   (width, "mtp_batch_off", off, [0.9, 0.95, 1.0]),
                   (width, "mtp_batch_on", on, [on / off * f for f in (0.97, 1.0, 1.04)]),
                   (width, batch.CONTROL, off, [0.98, 1.0, 1.03])]
    path = tmp_path / "batch.png"
    batch.plot(points, BATCH_LAST, str(path))
    assert written(path)
    keep(path)


def batch_of(seconds: float, tokens: int):
    return SimpleNamespace(seconds=seconds, tokens=tokens)


def test_serve_plot_draws_per_prompt_speedups_and_tok_s(tmp_path):
    results = {run: {s: [(batch_of(1.0 / (x + 0.05 * (i % 3)), 96), batch_of(1.0, 96)) for i in range(8)]
                     for s in ("chat", "code")}
               for run, x in (("served", 1.3), ("foreign", 1.2), ("K=1", 1.1), ("K=2", 1.4))}
    speedup, tok_s = serve.curves(results, ("chat", "code"))
    assert speedup["chat"]["served"][0] == pytest.approx(1.3) and tok_s["code"]["K=1"][1] == pytest.approx(96.0)
    path = tmp_path / "serve.png"
    last = ("served_speedup_chat=1.300 served_speedup_code=1.300 served_vs_best_fixed_min=0.930 "
            "foreign_speedup_chat=1.200 foreign_speedup_code=1.200 identical=1")
    serve.plot(speedup, tok_s, last, str(path))
    assert written(path)
    keep(path)


def test_replay_plot_draws_tokens_over_time_and_depths(tmp_path):
    result = Replay()
    for i in range(40):
        mtp = i % 4 != 0
        recorded = Choice("mtp", (2,)) if mtp else Choice("plain", ())
        replayed = Choice("mtp", (3,)) if i > 20 else recorded
        actual = Delivered(2.5 if mtp else 1.0, 0.09 if mtp else 0.07, None)
        delivered = Delivered(3.0, 0.1, None) if replayed != recorded else actual
        result.add(StepResult(i, "gate", recorded, replayed, actual, delivered, replayed != recorded))
    path = tmp_path / "replay.png"
    replay_plot(result, str(path))
    assert written(path)
    keep(path)


def test_the_benches_import_no_matplotlib_until_asked():
    code = ("import sys, runtime.bench.spec, runtime.bench.batch, runtime.bench.serve, runtime.replay_cli; "
            "sys.exit('matplotlib' in sys.modules)")
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


def test_hyper_plot_draws_tree_speedups_tok_s_and_layouts(tmp_path):
    def answers(seconds):
        return [hyper.Answer(seconds=x, tokens=96, text="t", receipt={}) for x in seconds]

    parity = {"serial": {"mixed": answers([5.0, 6.0])}, "hyper_w1": {"mixed": answers([5.1, 5.9])}}
    tree = {"hyper_w1": {s: answers([6.0, 6.0, 6.0]) for s in ("chat", "code")},
            "hyper_tree": {"chat": answers([5.0, 6.0, 5.5]), "code": answers([4.0, 5.0, 4.5])}}
    speedup, rates = hyper.curves(parity, tree)
    assert speedup["code"][0] == pytest.approx(1.5) and rates["chat"]["chain"] == pytest.approx(16.0)
    layout = [{"context": c, "cell": cell, "min_ratio": r, "median_ratio": r + 0.1, "plain_ms": 60.0}
              for c in (150, 700) for cell, r in (("chain", 1.2), ("mask", 1.4), ("rows", 1.9))]
    path = tmp_path / "hyper.png"
    hyper.plot(speedup, rates, layout, "parity_ratio=1.004 identical=1 tree_speedup_chat=1.098 "
               "tree_speedup_code=1.200", str(path))
    assert written(path)
    keep(path)
