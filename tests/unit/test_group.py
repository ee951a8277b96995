"""The distributed pieces that need no second process: the command framing, result digests, seeds
filled in by rank 0, the layer split, which models tensor parallel can split, and the clear errors
of a bad distributed configuration. (tests/integration/test_distributed.py runs real groups.)"""

import mlx.core as mx
import msgspec
import pytest

from actors.group_owner import with_seeds
from kernels.group import INLINE, Channel, digest, error_digest
from kernels.sharding import ShardingError, shard, split, tensor_problem
from runtime.config import Config, ConfigError, override
from runtime.messages import SamplingParams
from runtime.owner_messages import Decode, Decoded, Heartbeat, Prefill, PrefillChunk, Verified
from tests.tiny import tiny_llama


@pytest.fixture(scope="module")
def channel():
    return Channel(mx.distributed.init())  # a group of one: framing without a peer


@pytest.mark.parametrize("msg", [
    Decode(seq_ids=("a", "b"), lookahead=(True, False)),
    Prefill(seq_id="long", prompt_ids=tuple(range(40000, 41000)), params=SamplingParams(temperature=0.7, seed=3)),
    Heartbeat(),
])
def test_a_command_survives_its_framing(channel, msg):
    header, rest = channel.frame(msg, digest=7)
    assert len(header) == channel.head + INLINE and (len(rest) > 0) == (msg.__class__ is Prefill)
    assert channel.unframe(header, lambda n: rest[:n]) == msg
    assert channel._digests(header) == [7]


def test_the_digest_sees_tokens_not_timings():
    a = Verified(accepted=2, emitted=(5, 6, 7), seconds=0.1)
    assert digest(a) == digest(msgspec.structs.replace(a, seconds=0.9))
    assert digest(a) != digest(msgspec.structs.replace(a, emitted=(5, 6, 8)))
    assert digest(Decoded(tokens=(1,), seconds=0.0)) != error_digest(ValueError())
    assert digest(None) == digest(None)


def test_rank_0_fills_in_the_seed_of_a_sampled_prefill_only():
    sampled = Prefill(seq_id="s", prompt_ids=(1,), params=SamplingParams(temperature=0.8))
    greedy = Prefill(seq_id="g", prompt_ids=(1,), params=SamplingParams(temperature=0.0))
    seeded = with_seeds(sampled)
    assert seeded.params.seed is not None and with_seeds(greedy) is greedy
    chunk = with_seeds(PrefillChunk(items=(sampled, greedy), budget=0))
    assert chunk.items[0].params.seed is not None and chunk.items[1].params.seed is None


def test_the_layer_split_covers_every_layer_once_rank_0_last():
    for layers, size in ((30, 2), (30, 4), (7, 3), (2, 2)):
        ranges = [split(layers, size, r) for r in range(size)]
        covered = sorted(i for start, end in ranges for i in range(start, end))
        assert covered == list(range(layers)) and ranges[0][1] == layers


def test_tensor_parallel_needs_heads_that_divide():
    assert tensor_problem(tiny_llama(), 2) is None  # 4 heads, 2 KV heads
    assert "num_key_value_heads = 2" in tensor_problem(tiny_llama(), 4)
    default_like = tiny_llama(num_attention_heads=9, num_key_value_heads=3, hidden_size=72)
    assert "num_attention_heads = 9" in tensor_problem(default_like, 2)


class Pair:  # a stand-in group for the refusal (no collective runs)
    def size(self):
        return 2

    def rank(self):
        return 0


def test_a_model_tensor_parallel_cannot_split_is_refused_clearly():
    default_like = tiny_llama(num_attention_heads=9, num_key_value_heads=3, hidden_size=72)
    with pytest.raises(ShardingError, match="--parallel tensor: num_attention_heads = 9 .* --parallel pipeline"):
        shard(default_like, Pair(), "tensor")


def test_a_pipeline_stage_of_one_is_the_whole_model():
    model, whole = tiny_llama(seed=1), tiny_llama(seed=1)
    assert shard(model, mx.distributed.init(), "pipeline")[0] == "pipeline"
    tokens = mx.array([[3, 4, 5, 6]])
    assert mx.array_equal(model(tokens), whole(tokens)).item()


def test_bad_distributed_settings_are_refused():
    with pytest.raises(ConfigError, match="serial or mtp_batch"):
        override(override(Config(), "distributed", enabled=True), "scheduler", mode="hyper")
    with pytest.raises(ConfigError, match="--group-heartbeat-s"):
        override(Config(), "distributed", heartbeat_s=5.0, timeout_s=2.0)


def test_distributed_without_a_group_says_how_to_start_one():
    from runtime.cli import group_rank

    with pytest.raises(ConfigError, match="mlx.launch --backend ring -n 2"):
        group_rank(override(Config(), "distributed", enabled=True))


def test_an_mlx_lm_pipeline_architecture_keeps_only_its_stage_and_computes_the_same():
    from mlx_lm.models import qwen2
    from mlx_lm.models.cache import make_prompt_cache

    args = qwen2.ModelArgs(model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, rms_norm_eps=1e-5, vocab_size=128, num_key_value_heads=2)
    mx.random.seed(2)
    model = qwen2.Model(args)
    mx.eval(model.parameters())
    tokens = mx.array([[3, 4, 5, 6]])
    whole = model(tokens)
    assert shard(model, mx.distributed.init(), "pipeline")[0] == "pipeline"
    assert len(make_prompt_cache(model)) == len(model.layers) == 2  # one cache per kept layer
    assert mx.array_equal(model(tokens, cache=make_prompt_cache(model)), whole).item()
