"""Hyper mode on the real actor system serving tiny random models: width 1 is serial mode's output
and receipts; the tree executor (n-gram branches, MTP spines with alternative leaves) keeps greedy
output identical to plain decode, and its forks show in the scheduler.hyper block."""

from __future__ import annotations

import msgspec
import pytest

from runtime.bench._inprocess import Served, fixed_depth, plain, private_cache
from runtime.config import load_config, override
from runtime.messages import SamplingParams
from runtime.tree_plan import TreePlanner
from tests.tiny import save_tiny_dir

PROMPTS = [[7, 8, 9, 10] * 6, [3, 4, 5, 3, 4, 6, 3, 4, 7] * 2, [11, 12] * 9]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=5)


@pytest.fixture(scope="module")
def mtp_model_dir(tmp_path_factory):
    import mlx.core as mx

    from kernels.mtp_head import MTPConfig, MTPHead, save_mtp_head

    folder = save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny-mtp", seed=5)
    mx.random.seed(5)
    head = MTPHead(MTPConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128))
    mx.eval(head.parameters())
    save_mtp_head(head, folder)
    return folder


def hyper(config, executor="tree", width=3):
    return override(config, "scheduler", mode="hyper", hyper_width_executor=executor, hyper_max_width=width)


def without_seconds(receipt):
    return msgspec.structs.replace(receipt, verify_seconds=0.0, plain_seconds=0.0)


async def test_width_one_is_serial_output_and_receipts(model_dir):
    forced = fixed_depth(load_config(), "ngram", 3)
    results = {}
    for name, config in (("serial", forced), ("hyper", hyper(forced, "none"))):
        async with Served(config, model_dir) as client:
            results[name] = [await client.generate(p, GREEDY) for p in PROMPTS]
            state = client.system.scheduler.describe()
        if name == "hyper":
            assert state["hyper"]["completed_total"] == len(PROMPTS) and not state["hyper"]["width_executor_installed"]
    for a, b in zip(results["serial"], results["hyper"]):
        assert a.tokens == b.tokens and without_seconds(a.receipt) == without_seconds(b.receipt)


@pytest.fixture
def keep_every_alternative(monkeypatch):
    """The controller drafts 2 wherever it may and the planner keeps every candidate: the tree path
    runs on every speculative step (a random head's drafts would rarely pay by measurement)."""
    from runtime.controller import OnlineController
    from runtime.step_plan import Plan

    monkeypatch.setattr(OnlineController, "plan", lambda self, batch, eligible, explore=True:
                        Plan(tuple(2 if ok else 0 for ok in eligible)))
    monkeypatch.setattr(TreePlanner, "choose", lambda self, table, accept, tokens, draft_ms, candidates:
                        list(candidates)[:self.max_width - 1])


@pytest.mark.parametrize("which", ["ngram", "mtp"])
async def test_tree_steps_keep_greedy_output_identical_to_plain_decode(which, model_dir, mtp_model_dir,
                                                                       keep_every_alternative):
    folder = model_dir if which == "ngram" else mtp_model_dir
    config = override(hyper(load_config()), "spec", drafter=which, mtp_gate="force")
    with private_cache(config) as config:
        async with Served(config, folder) as client:
            assert client.system.info.drafter == which
            pairs = [(await client.generate(p, plain(GREEDY)), await client.generate(p, GREEDY)) for p in PROMPTS]
            block = client.system.scheduler.describe()["hyper"]
    assert all(a.tokens == b.tokens for a, b in pairs)
    stats = block["width_stats"]
    assert block["width_executor_installed"] and block["tree"]["branching"] == {"ok": True, "reason": ""}
    assert stats["fork_attempts"] > 0 and stats["self_spec_rows_launched"] >= stats["fork_attempts"]
    assert max(stats["requests_by_width"]) > 1 and stats["requests_by_width"].get(1, 0) >= len(PROMPTS)  # plain ones
    assert block["steps_by_kind"].get("tree", 0) == stats["fork_attempts"]
    if which == "ngram":  # a random head's drafts are never the target's; repeated text's are
        assert sum(b.receipt.accepted_tokens for _, b in pairs) > 0


async def test_the_tree_plans_width_one_without_a_cost_model(model_dir):
    config = hyper(fixed_depth(load_config(), "ngram", 3))  # --spec-cost-model off: nothing measured
    async with Served(config, model_dir) as client:
        reference = await client.generate(PROMPTS[0], plain(GREEDY))
        result = await client.generate(PROMPTS[0], GREEDY)
        block = client.system.scheduler.describe()["hyper"]
    assert result.tokens == reference.tokens and result.receipt.verify_steps > 0
    assert block["width_stats"]["fork_attempts"] == 0 and block["width_stats"]["requests_by_width"] == {1: 2}
