"""metrale bench spec's sweep through the served actor system on a tiny random model, and its
speedups: pooled over the prompts, and the median of per-prompt speedups beside it."""

from __future__ import annotations

import pytest

from runtime.bench._inprocess import Result, fixed_depth, served_all
from runtime.bench.spec import PLAIN, by_position, speedups, sweep
from runtime.config import load_config
from runtime.messages import SpecReceipt, Usage
from tests.tiny import save_tiny_dir

PROMPTS = [[7, 8, 9, 10] * 6, [3, 4, 5] * 5]


async def test_every_depth_reproduces_plain_decode_with_receipts(tmp_path):
    model_dir = save_tiny_dir(tmp_path / "tiny", seed=5)
    configs = {("ngram", k): fixed_depth(load_config(), "ngram", k) for k in (1, 3)}
    async with served_all(configs, model_dir) as clients:
        runs = await sweep({PLAIN: clients[("ngram", 1)], **clients}, PROMPTS, 12, "ids")
    assert list(runs) == [PLAIN, ("ngram", 1), ("ngram", 3)]
    assert all(len(results) == 2 and all(len(r.tokens) == 12 for r in results) for results in runs.values())
    assert by_position(runs[PLAIN], 0) == ([], [])
    drafted, accepted = by_position(runs[("ngram", 3)], 3)
    assert drafted[0] > 0 and all(a <= d for a, d in zip(accepted, drafted))


def result(tokens: int, seconds: float) -> Result:
    usage = Usage(prompt_tokens=1, completion_tokens=tokens, total_tokens=tokens + 1, speculation=SpecReceipt())
    return Result([0] * tokens, usage, seconds, seconds)


def test_one_lucky_prompt_moves_the_pooled_speedup_not_the_median():
    plain = [result(10, 1.0), result(10, 1.0), result(100, 10.0)]
    spec = [result(10, 1.0), result(10, 1.0), result(100, 2.0)]  # 5x on the long prompt only
    pooled, median = speedups(spec, plain)
    assert pooled == pytest.approx(120 / 4 / (120 / 12)) and median == 1.0
