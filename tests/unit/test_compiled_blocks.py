"""Compiled decoder layers (kernels/compiled_blocks.py) give the stock layers' logits bit for bit: on
tiny random llamas of random shapes at every step kind (prefill, decode, verify, a left-padded batch
cache), on the default model's weights, and after the rows kernel is swapped out under them. These run
the compiled layers with mlx-lm's ops; the fused kernels, which are not bit-identical to them,
have their own tests (tests/unit/test_fused_kernels.py)."""

from __future__ import annotations

import contextlib

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.models.llama import TransformerBlock

from kernels import compiled_blocks, rows_matmul
from tests.tiny import tiny_llama


def twins(seed: int, **shape):
    """The same random llama twice: one stock, one with compiled layers (mlx-lm's ops)."""
    stock, mine = tiny_llama(seed=seed, **shape), tiny_llama(seed=seed, **shape)
    assert compiled_blocks.install(mine, fused_kernels=False) == len(mine.model.layers)
    return stock, mine


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([(32, 2, 1), (64, 4, 2), (48, 4, 4)]),
       st.lists(st.integers(1, compiled_blocks.MAX_ROWS), min_size=1, max_size=5), st.integers(1, 30))
def test_compiled_layers_give_the_stock_logits_at_every_step(seed, heads, steps, prompt):
    hidden, n_heads, kv_heads = heads
    stock, mine = twins(seed, hidden_size=hidden, num_attention_heads=n_heads, num_key_value_heads=kv_heads,
                        intermediate_size=2 * hidden)
    caches = make_prompt_cache(stock), make_prompt_cache(mine)
    tokens = [mx.array([[(seed + 7 * i) % 100 + 1 for i in range(prompt)]])]  # prefill (stock above MAX_ROWS)
    tokens += [mx.array([[(seed + r) % 90 + 2 for r in range(rows)]]) for rows in steps]  # decode, verify
    for step in tokens:
        assert mx.array_equal(mine(step, cache=caches[1]), stock(step, cache=caches[0])).item()


def test_a_left_padded_batch_cache_too():
    stock, mine = twins(3)
    rows = mx.array([[0, 0, 5, 9, 14, 3], [8, 2, 6, 1, 7, 4]])
    caches = [[BatchKVCache([2, 0]) for _ in m.model.layers] for m in (stock, mine)]
    for step in (rows, mx.array([[11], [12]]), mx.array([[3, 4, 5], [6, 7, 8]])):
        assert mx.array_equal(mine(step, cache=caches[1]), stock(step, cache=caches[0])).item()


def test_swapping_the_rows_kernel_out_traces_the_layers_again():
    stock, mine = twins(5)
    caches = make_prompt_cache(stock), make_prompt_cache(mine)
    mine(mx.array([[1, 2, 3]]), cache=caches[1]), stock(mx.array([[1, 2, 3]]), cache=caches[0])
    traced = mine.model.layers[0]._compiled
    rows_matmul.uninstall(mine)
    assert mx.array_equal(mine(mx.array([[4]]), cache=caches[1]), stock(mx.array([[4]]), cache=caches[0])).item()
    assert mine.model.layers[0]._compiled is not traced  # rows_matmul.swaps moved on


def test_uninstall_restores_the_stock_layers_and_names_stay():
    stock, mine = twins(1)
    names = [name for name, _ in mine.parameters().items()]
    compiled_blocks.uninstall(mine)
    assert all(type(layer) is TransformerBlock for layer in mine.model.layers)
    assert names == [name for name, _ in stock.parameters().items()]


def test_the_default_models_weights_give_the_stock_logits():
    from kernels.default_model import default_model_dir
    from kernels.loader import load

    if not (default_model_dir() / "config.json").exists():
        pytest.skip("default model not fetched")
    served, stock = load(default_model_dir(), fused_kernels=False), load(default_model_dir(), compiled=False)
    assert served.matmul.endswith(", compiled layers") and "compiled" not in stock.matmul
    caches = make_prompt_cache(served.model), make_prompt_cache(stock.model)
    for step in (mx.array([[1, 504, 3458, 314, 2]]), mx.array([[28]]), mx.array([[11, 905, 42, 7]])):
        mine, want = served.model(step, cache=caches[0]), stock.model(step, cache=caches[1])
        assert mx.array_equal(mine, want).item()


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.integers(1, compiled_blocks.MAX_ROWS), min_size=1, max_size=4),
       st.booleans())
def test_a_compiled_mtp_head_block_gives_the_stock_outputs(seed, steps, gated):
    from kernels.mtp_head import MTPBlock, MTPConfig, MTPHead

    def head():
        mx.random.seed(seed)
        return MTPHead(MTPConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=64, gated_attention=gated))

    stock, mine = head(), head()
    assert compiled_blocks.install_head(mine, fused_kernels=False) == 1
    target = tiny_llama(seed=seed, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
    embed, norm = target.model.embed_tokens, target.model.norm
    caches = stock.make_cache(), mine.make_cache()
    for rows in [9] + steps:  # the first feed is more than a draft's pairs: it takes the stock path too
        hidden = mx.random.normal((1, rows, 32), key=mx.random.key(seed + rows))
        tokens = mx.array([[(seed + r) % 90 + 2 for r in range(rows)]])
        want = stock.forward(hidden, tokens, embed, norm, caches[0])
        assert mx.array_equal(mine.forward(hidden, tokens, embed, norm, caches[1]), want).item()
    assert type(mine.layers[0]) is compiled_blocks.CompiledMTPBlock and type(stock.layers[0]) is MTPBlock
    assert (mine.layers[0]._compiled is None) == gated  # a gated attention always runs stock


def test_traces_count_a_new_shapes_first_step_only():
    """The owner's replies carry this count, and the controller takes a step that moved it as a
    shape's one-time cost (runtime/controller.py)."""
    _, mine = twins(3)
    cache = make_prompt_cache(mine)
    mine(mx.array([[5, 6, 7]]), cache=cache)  # a 3-row step: 2 graphs per layer traced
    start = compiled_blocks.traces
    mx.eval(mine(mx.array([[8]]), cache=cache))  # one row: a new shape
    first = compiled_blocks.traces
    mx.eval(mine(mx.array([[9]]), cache=cache), mine(mx.array([[10, 11, 12]]), cache=cache))  # both seen
    assert first - start == 2 * len(mine.model.layers) and compiled_blocks.traces == first


on_the_kernel = pytest.mark.skipif(not rows_matmul.available(), reason=f"rows kernel {rows_matmul.status()}")


@contextlib.contextmanager
def every_row_count_on_the_kernel():
    saved = rows_matmul._rows
    rows_matmul._rows = frozenset(range(1, compiled_blocks.MAX_ROWS + 1))
    try:
        yield
    finally:
        rows_matmul._rows = saved


def kernel_twins(seed: int, fused_kernels: bool):
    """The same random llama twice on the rows kernel, compiled: one with stacked products, one with
    its stacks taken away (one product a layer each, as before stacking)."""
    models = [tiny_llama(seed=seed, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=96) for _ in range(2)]
    for m in models:
        rows_matmul.install(m)
        compiled_blocks.install(m, fused_kernels)
    for layer in models[1].model.layers:
        object.__setattr__(layer, "_stacks", {})
    return models


@on_the_kernel
@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.integers(1, compiled_blocks.MAX_ROWS), min_size=1, max_size=4),
       st.booleans())
def test_stacked_products_keep_every_logit_bit_for_bit(seed, steps, fused_kernels):
    with every_row_count_on_the_kernel():
        stacked, separate = kernel_twins(seed, fused_kernels)
        _same_logits(stacked, separate, [20] + steps)  # a prefill chunk above MAX_ROWS, then decode and verify


def _same_logits(stacked, separate, rows_per_step, seed: int = 1) -> None:
    assert set(stacked.model.layers[0]._stacks) == {"qkv", "gate_up"}
    caches = make_prompt_cache(stacked), make_prompt_cache(separate)
    for rows in rows_per_step:
        step = mx.array([[(seed + 3 * r) % 90 + 2 for r in range(rows)]])
        assert mx.array_equal(stacked(step, cache=caches[0]), separate(step, cache=caches[1])).item()


@on_the_kernel
def test_the_separate_weights_are_views_of_the_stack():
    stacked, _ = kernel_twins(2, True)
    attn = stacked.model.layers[0].self_attn
    qkv = stacked.model.layers[0]._stacks["qkv"]
    assert qkv.weight.shape[0] == sum(p.weight.shape[0] for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    assert mx.array_equal(qkv.weight[:attn.q_proj.weight.shape[0]], attn.q_proj.weight).item()
    assert all(p.weight is w for p, w in zip((attn.q_proj, attn.k_proj, attn.v_proj), qkv.parts))


@on_the_kernel
def test_weights_loaded_after_stacking_are_the_ones_used():
    """A stack whose layers took new weights is stale: the products read the layers' own again."""
    with every_row_count_on_the_kernel():
        stacked, separate = kernel_twins(6, True)
        fresh = tiny_llama(seed=99, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=96)
        for m in (stacked, separate):
            m.update(fresh.parameters())
        rows_matmul.swaps += 1  # graphs trace again, as any swap makes them
        _same_logits(stacked, separate, [3, 1])
        _same_logits(fresh_compiled(fresh), separate, [3, 1])


def fresh_compiled(model):
    rows_matmul.install(model)
    compiled_blocks.install(model)
    return model


@on_the_kernel
@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.integers(1, compiled_blocks.MAX_ROWS), min_size=1, max_size=4))
def test_float16_copies_of_exact_weights_keep_every_logit_bit_for_bit(seed, steps):
    """Weights that are all float16 values (as the default model's): the kernel reads float16 copies,
    the stacks' own (the separate layers' are dropped), and every logit keeps its bits."""
    if not rows_matmul.load().HALF_WEIGHTS:
        pytest.skip("no float16 conversion in this build")
    from mlx.utils import tree_map

    with every_row_count_on_the_kernel():
        models = []
        for _ in range(2):
            m = tiny_llama(seed=seed, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=96)
            m.update(tree_map(lambda p: p.astype(mx.float16).astype(mx.float32), m.parameters()))
            models.append(fresh_compiled(m))
        layer = models[0].model.layers[0]
        assert layer._stacks["qkv"].half is not None and layer.self_attn.q_proj._half is None
        assert layer.mlp.down_proj._half is not None and models[0].model.embed_tokens._half is not None
        caches = make_prompt_cache(models[0]), make_prompt_cache(models[1])
        for i, rows in enumerate([20] + steps):  # a prefill chunk above MAX_ROWS (stock), then the kernel's
            step = mx.array([[(7 * i + 3 * r) % 90 + 2 for r in range(rows)]])
            halves = models[0](step, cache=caches[0])
            rows_matmul.use_half_weights(False)
            try:
                singles = models[1](step, cache=caches[1])
            finally:
                rows_matmul.use_half_weights(True)
            assert mx.array_equal(halves, singles).item()
