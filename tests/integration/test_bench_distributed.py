"""metrale bench distributed end to end, small: one process and a 2-rank ring group on loopback
serve the same prompts; the table has both, the group's communication is measured, the outputs agree."""

import re

import pytest

from runtime.bench import distributed
from runtime.bench._group import ring_available


@pytest.mark.skipif(ring_available() is not None, reason=f"no mlx.launch here: {ring_available()}")
def test_bench_distributed_prints_both_servers_the_split_and_the_last_line(model_dir, capsys):
    assert distributed.main(["--prompts", "1", "--max-tokens", "12"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(r"identical=1 tok_s_ratio=(\d+\.\d+) comm_share=(\d+\.\d+)", out[-1])
    assert last and float(last[1]) > 0 and 0 < float(last[2]) < 1
    rows = {line.split()[0]: line.split() for line in out if line.split() and line.split()[0] in ("single", "2")}
    assert set(rows) == {"single", "2"} and float(rows["single"][-1]) == 0.0  # alone: no communication
    assert any(line.startswith("group: pipeline over 2 processes") for line in out)
