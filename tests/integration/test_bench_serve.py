"""metrale bench serve end to end, small: a served and a fixed-K server subprocess, the openai client,
a table row per run and the last key=value line; and its window and receipt arithmetic."""

import math
import re

from runtime.bench import serve
from runtime.bench._served import Answer, Batch


def _pair(spec_s: float, plain_s: float) -> tuple:
    return Batch(spec_s, (Answer(spec_s, 4, "x", {}),)), Batch(plain_s, (Answer(plain_s, 4, "x", {}),))


def test_worst_window_is_the_lowest_ratio_of_summed_seconds():
    pairs = [_pair(1.0, 1.0), _pair(2.0, 1.0), _pair(1.0, 1.0), _pair(1.0, 3.0)]
    assert serve.worst_window(pairs, 2) == 2.0 / 3.0  # groups 1-2 and 2-3 tie at 2/3
    assert serve.worst_window(pairs, 10) == 6.0 / 5.0  # fewer groups than the window: all of them


def test_receipts_sum_by_position():
    receipts = [{"drafted_by_position": [2, 2], "accepted_by_position": [1, 0], "verify_steps": 2, "plain_steps": 2},
                {"drafted_by_position": [2], "accepted_by_position": [2], "verify_steps": 2, "plain_steps": 0}]
    acc = serve.acceptance(receipts)
    assert acc[:2] == (0.75, 0.0) and all(math.isnan(a) for a in acc[2:])
    assert serve.spec_share(receipts) == 4 / 6


def test_bench_serve_runs_served_and_fixed_k_with_identical_outputs(model_dir, capsys):
    argv = ["--prompts", "2", "--max-tokens", "8", "--fixed-k", "1", "--skip-foreign", "--sets", "chat",
            "--objectives", "balanced,latency"]
    assert serve.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    keys = dict(kv.split("=") for kv in out[-1].split())
    assert list(keys) == ["served_speedup_chat", "served_speedup_code", "served_vs_best_fixed_min", "identical"]
    assert float(keys["served_speedup_chat"]) > 0 and keys["served_speedup_code"] == "nan"
    assert float(keys["served_vs_best_fixed_min"]) > 0
    assert keys["identical"] == "1"
    for run in ("served", "served:latency", "K=1"):
        assert any(re.match(rf"\s*{re.escape(run)}\s+\d+\s", line) for line in out), run


def test_objective_runs_ask_for_their_objective_and_unknown_ones_are_refused():
    assert serve.request_fields("served:energy") == {"objective": "energy"}
    assert serve.request_fields("served") == {} and serve.request_fields("K=2") == {}
    import pytest

    with pytest.raises(SystemExit):
        serve._parser().parse_args(["--objectives", "balanced,fastest"])
