"""The in-process client of benchmarks and calibration, on the real actor system serving a tiny
random model: fixed-depth speculation reproduces plain decode, receipts and step records agree,
and a group decodes as one batch in mtp_batch mode."""

from __future__ import annotations

import pytest

from runtime import sequence
from runtime.bench._inprocess import Served, at_width, fixed_depth, plain, served_all
from runtime.config import load_config
from runtime.messages import SamplingParams
from tests.tiny import save_tiny_dir

PROMPTS = [[7, 8, 9, 10] * 6, [3, 4, 5] * 5, [11, 12] * 9]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=5)


async def test_fixed_depth_reproduces_plain_decode_and_records_every_verify(model_dir):
    async with Served(fixed_depth(load_config(), "ngram", 3), model_dir) as client:
        reference = await client.generate(PROMPTS[0], plain(GREEDY))
        result = await client.generate(PROMPTS[0], GREEDY, record=True)
    assert len(reference.tokens) == 20 and result.tokens == reference.tokens
    assert reference.receipt.verify_steps == 0 and reference.steps is None
    receipt, steps = result.receipt, result.steps
    assert receipt.verify_steps == len(steps) > 0
    assert sum(s.drafted for s in steps) == receipt.drafted_tokens
    assert sum(s.accepted for s in steps) == receipt.accepted_tokens
    assert all(s.confidences == () and 1 <= s.drafted <= 3 for s in steps)  # n-gram: no confidences
    assert 0 < result.first_s <= result.seconds
    assert not sequence._RECORDERS  # every recorder went to its sequence or was dropped


async def test_a_group_decodes_together_in_mtp_batch_mode(model_dir):
    configs = {k: at_width(fixed_depth(load_config(), "ngram", k), 3) for k in (1, 4)}
    async with served_all(configs, model_dir) as clients:
        plain_group = await clients[1].group(PROMPTS, plain(GREEDY))
        group = await clients[4].group(PROMPTS, GREEDY)
        steps = clients[4].system.scheduler.describe()["mtp_batch"]["batch_width_histogram"]
    assert [r.tokens for r in group.results] == [r.tokens for r in plain_group.results]
    assert sum(r.receipt.verify_steps for r in group.results) > 0
    sent, all_first, ended = group.marks
    assert sent <= all_first <= ended
    assert max(steps) == 3  # the three requests stepped as one batch


async def test_a_prompt_past_the_context_is_refused(model_dir):
    async with Served(load_config(), model_dir) as client:
        with pytest.raises(ValueError, match="do not fit"):
            await client.generate([5] * 500, GREEDY)
