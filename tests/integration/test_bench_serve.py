"""metrale bench serve end to end, small: a served and a fixed-K server subprocess, the openai client,
a table row per run and the last key=value line; and its window and receipt arithmetic."""

import math
import re

from runtime.bench import serve
from runtime.bench._served import Answer, Batch, fastest


def _pair(spec_s: float, plain_s: float) -> tuple:
    return Batch(spec_s, (Answer(spec_s, 4, "x", {}),)), Batch(plain_s, (Answer(plain_s, 4, "x", {}),))


def test_worst_window_is_the_lowest_ratio_of_summed_seconds():
    pairs = [_pair(1.0, 1.0), _pair(2.0, 1.0), _pair(1.0, 1.0), _pair(1.0, 3.0)]
    assert serve.worst_window(pairs, 2) == 2.0 / 3.0  # groups 1-2 and 2-3 tie at 2/3
    assert serve.worst_window(pairs, 10) == 6.0 / 5.0  # fewer groups than the window: all of them


def test_leg_order_puts_each_leg_first_as_often_as_second():
    runs = ["served", "K=1", "A/A"]
    firsts = {}
    for group in range(4):
        for repeat in range(2):
            order = serve.leg_order(runs, group, repeat)
            assert sorted(order) == sorted((r, off) for r in runs for off in (False, True))
            for i in range(0, len(order), 2):  # a run's two legs are adjacent
                assert order[i][0] == order[i + 1][0]
                firsts[order[i]] = firsts.get(order[i], 0) + 1
    assert all(firsts.get((r, off)) == 4 for r in runs for off in (False, True))


def test_fastest_repeat_is_timed_and_every_repeat_is_compared():
    slow, fast = _pair(3.0, 2.0), _pair(2.0, 1.0)
    spec = fastest([slow[0], Batch(2.5, (Answer(2.5, 4, "y", {}),))])
    plain = fastest([slow[1], fast[1]])
    assert spec.seconds == 2.5 and plain.seconds == 1.0 and [a.text for a in spec.every_answer] == ["y", "x"]
    got = serve.stats([(spec, plain)], 5)
    assert got.speedup == 1.0 / 2.5 and (got.same, got.compared) == (2, 3)  # the "y" repeat differs


def test_receipts_sum_by_position():
    receipts = [{"drafted_by_position": [2, 2], "accepted_by_position": [1, 0], "verify_steps": 2, "plain_steps": 2},
                {"drafted_by_position": [2], "accepted_by_position": [2], "verify_steps": 2, "plain_steps": 0}]
    acc = serve.acceptance(receipts)
    assert acc[:2] == (0.75, 0.0) and all(math.isnan(a) for a in acc[2:])
    assert serve.spec_share(receipts) == 4 / 6


def test_bench_serve_runs_served_and_fixed_k_with_identical_outputs(model_dir, capsys):
    argv = ["--prompts", "2", "--max-tokens", "8", "--fixed-k", "1", "--skip-foreign", "--sets", "chat",
            "--objectives", "balanced,latency", "--repeats", "2", "--control"]
    assert serve.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    keys = dict(kv.split("=") for kv in out[-1].split())
    assert list(keys) == ["served_speedup_chat", "served_speedup_code", "served_vs_best_fixed_min",
                          "control_worst5_min", "identical"]
    assert float(keys["control_worst5_min"]) > 0
    assert float(keys["served_speedup_chat"]) > 0 and keys["served_speedup_code"] == "nan"
    assert float(keys["served_vs_best_fixed_min"]) > 0
    assert keys["identical"] == "1"
    for run in ("served", "served:latency", "K=1", "A/A"):
        assert any(re.match(rf"\s*{re.escape(run)}\s+\d+\s", line) for line in out), run


def test_objective_runs_ask_for_their_objective_and_unknown_ones_are_refused():
    assert serve.request_fields("served:energy") == {"objective": "energy", "cache_prompt": False}
    assert serve.request_fields("served") == {"cache_prompt": False} == serve.request_fields("K=2")
    import pytest

    with pytest.raises(SystemExit):
        serve._parser().parse_args(["--objectives", "balanced,fastest"])
