"""metrale bench batch end to end at two small widths: the three systems each run every round, the
table has a row per (width, system) and the last line carries both ratios."""

import re

from runtime.bench import batch
from runtime.bench.serving import Timing


def test_ratios_pair_runs_by_round_and_take_the_median():
    slow_round = [Timing(10, 10.0, []), Timing(30, 1.0, []), Timing(20, 1.0, [])]
    baseline = [Timing(10, 5.0, []), Timing(30, 1.2, []), Timing(20, 1.0, [])]
    # Per round: 0.5, 1.2, 1.0 -> median 1.0; pooled tokens over seconds would say 0.6.
    assert batch.median_ratio(slow_round, baseline) == 1.0


def test_bench_batch_prints_every_system_and_the_ratios(model_dir, capsys):
    assert batch.main(["--widths", "1,2", "--max-tokens", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(r"min_ratio_off_vs_batchgen=(\d+\.\d+) min_ratio_on_vs_off=(\d+\.\d+)", out[-1])
    assert last and all(float(x) > 0 for x in last.groups())
    for width in (1, 2):
        for system in batch.SYSTEMS:
            assert any(re.match(rf"\s*{width}\s+{system}\s+{width * 4}\b", line) for line in out), (width, system)
