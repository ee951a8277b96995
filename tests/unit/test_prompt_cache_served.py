"""The prompt cache through the real actor system (mtp_batch, a tiny random model): a newcomer with a
cached prefix, arriving in one prefill group with misses while another request decodes (so the
misses prefill in budgeted chunks), starts at once and every request answers as with the cache off."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from runtime.bench._inprocess import Served, at_width, fixed_depth
from runtime.config import load_config, override
from runtime.messages import SamplingParams
from tests.tiny import save_tiny_dir

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
FIRST = [7, 8, 9, 10, 11, 12] * 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=6)


def config(cache: bool):
    c = at_width(fixed_depth(load_config(), "ngram", 2), 4)
    c = override(c, "scheduler", prefill_floor=8, prefill_ceiling=16, batch_wait_ms=20.0)
    return override(c, "model", prompt_cache_size=10 if cache else 0)


async def conversation(model_dir, cache: bool):
    async with Served(config(cache), model_dir) as client:
        first = await client.generate(FIRST, GREEDY)
        long_run = asyncio.ensure_future(client.generate([3, 4] * 20, msgspec.structs.replace(GREEDY, max_tokens=400)))
        await asyncio.sleep(0.05)  # it decodes: the group below prefills in budgeted chunks between its steps
        hit = FIRST + first.tokens + [5, 6]
        group = await client.group([hit, list(range(20, 120)), list(range(40, 110))], GREEDY)
        assert not long_run.done()  # the group prefilled while it decoded
        account = client.system.owner.describe_cache()
        return first, await long_run, group, account


async def test_a_hit_in_a_group_with_misses_starts_at_once_and_all_answer_as_uncached(model_dir):
    cached = await conversation(model_dir, cache=True)
    uncached = await conversation(model_dir, cache=False)
    first, long_run, group, account = cached
    assert first.tokens == uncached[0].tokens and long_run.tokens == uncached[1].tokens
    assert [r.tokens for r in group.results] == [r.tokens for r in uncached[2].results]
    details = [r.usage.prompt_tokens_details.cached_tokens for r in group.results]
    assert details[0] >= len(FIRST) + len(first.tokens) - 1 and details[1:] == [0, 0]
    assert group.results[0].first_s < min(r.first_s for r in group.results[1:])  # it did not wait for them
    assert account["hits"] >= 1 and uncached[3] == {"enabled": False}
