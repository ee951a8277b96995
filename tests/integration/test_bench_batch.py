"""metrale bench batch end to end at two small widths: the three systems each run every round, the
table has a row per (width, system) and the last line carries both ratios."""

import json
import re
from collections import Counter

from runtime.bench import batch
from runtime.bench.serving import Timing


def test_ratios_pair_runs_by_round_and_take_the_median():
    slow_round = [Timing(10, 10.0, []), Timing(30, 1.0, []), Timing(20, 1.0, [])]
    baseline = [Timing(10, 5.0, []), Timing(30, 1.2, []), Timing(20, 1.0, [])]
    # Per round: 0.5, 1.2, 1.0 -> median 1.0; pooled tokens over seconds would say 0.6.
    ratios = batch.round_ratios(slow_round, baseline)
    assert ratios == [0.5, 1.2, 1.0]
    line = batch.summary([ratios, [0.9, 0.95, 0.97]], [[1.1, 1.0, 0.99], [0.98, 1.01, 1.02]])
    # A width is a loss only when every round is below 1.0: the second width of "off", none of "on".
    assert line == ("min_ratio_off_vs_batchgen=0.950 min_ratio_on_vs_off=1.000 "
                    "widths_lost_off_vs_batchgen=1 widths_lost_on_vs_off=0")


def test_bench_batch_prints_every_system_and_the_ratios(model_dir, capsys, tmp_path):
    traces = tmp_path / "steps.jsonl"
    assert batch.main(["--widths", "1,2", "--max-tokens", "4", "--rounds", "1", "--control",
                       "--traces", str(traces)]) == 0
    steps = [json.loads(line) for line in traces.read_text().splitlines()]
    assert steps[0]["type"] == "header" and {s["width"] for s in steps[1:] if s["type"] == "step"} >= {1, 2}
    out = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(r"min_ratio_off_vs_batchgen=(\d+\.\d+) min_ratio_on_vs_off=(\d+\.\d+) "
                        r"widths_lost_off_vs_batchgen=([0-2]) widths_lost_on_vs_off=([0-2])", out[-1])
    assert last and all(float(x) > 0 for x in last.groups()[:2])
    for width in (1, 2):
        for system in batch.SYSTEMS + (batch.CONTROL,):
            tokens = len(batch.waves_of(batch.PROMPTS, width)) * width * 4
            assert any(re.match(rf"\s*{width}\s+{system}\s+{tokens}\b", line) for line in out), (width, system)


def test_a_round_sends_eight_requests_or_more_in_waves_over_the_prompts_in_turn():
    texts = [f"p{i}" for i in range(8)]
    assert batch.waves_of(texts, 1) == [[t] for t in texts]
    assert batch.waves_of(texts, 4) == [texts[:4], texts[4:]]
    assert batch.waves_of(texts, 3) == [texts[:3], texts[3:6], texts[6:] + texts[:1]]
    assert batch.waves_of(texts, 16) == [texts + texts]


def test_prompt_sets_are_the_mixed_eight_or_a_held_out_set():
    assert batch.prompt_texts("mixed") == batch.PROMPTS
    code = batch.prompt_texts("code")
    assert len(code) > 8 and all(isinstance(p, str) and p for p in code)
    assert not set(code) & set(batch.prompt_texts("chat"))


def test_the_command_exits_cleanly_after_its_last_system_stops(model_dir):
    # Its model owners' threads end right before the interpreter does: each must be gone first (its
    # exit frees MLX's thread-local compile cache under the GIL), or the process aborts (exit 134).
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-m", "runtime.cli", "bench", "batch", "--rounds", "1", "--widths", "1",
                           "--max-tokens", "8"], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr


def test_each_system_follows_each_other_one_over_the_rounds():
    from runtime.bench.batch import CONTROL, SYSTEMS, round_order

    for systems in (SYSTEMS, SYSTEMS + (CONTROL,), tuple("abcde")):
        n = len(systems)
        follows = Counter()
        for r in range(n if n % 2 == 0 else 2 * n):
            order = round_order(systems, r)
            assert sorted(order) == sorted(systems)
            follows.update(zip(order, order[1:]))
        assert len(set(follows.values())) == 1 and len(follows) == n * (n - 1)  # every pair, equally often
