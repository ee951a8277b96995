"""The fused few-rows kernels (kernels/rows_matmul/attention.cpp, activation.cpp): MLX's attention and
SwiGLU within float tolerance on random shapes, cache views and masks; each row bit for bit the same
whatever rows came with it (a verify row is the plain step at its position); and the compiled layers
that run them give the stock layers' logits within tolerance, at every step kind."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from kernels import compiled_blocks, rows_matmul
from tests.tiny import tiny_llama

pytestmark = pytest.mark.skipif(not rows_matmul.available(), reason=f"rows kernel {rows_matmul.status()}")


def fused(q, k, v, scale, causal, mask=None):
    return rows_matmul.load().few_rows_attention(q, k, v, scale, causal, mask)


def merged(out):
    batch, _, rows, _ = out.shape
    return out.transpose(0, 2, 1, 3).reshape(batch, rows, -1)


def cache_views(key, batch, kv_heads, keys, dim, room):
    """Keys and values as a KV cache hands them out: views of a longer buffer."""
    k1, k2 = mx.random.split(key)
    buffers = [mx.random.normal((batch, kv_heads, keys + room, dim), key=k) for k in (k1, k2)]
    return [b[..., :keys, :] for b in buffers]


shapes = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 16),
                   st.integers(0, 200), st.sampled_from([8, 16, 24, 64, 72]), st.integers(0, 40))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16), shapes, st.sampled_from(["none", "causal", "array"]))
def test_it_matches_mlx_attention(seed, shape, kind):
    batch, kv_heads, group, rows, past, dim, room = shape
    key = mx.random.key(seed)
    q = mx.random.normal((batch, kv_heads * group, rows, dim), key=key)
    k, v = cache_views(mx.random.key(seed + 1), batch, kv_heads, past + rows, dim, room)
    scale = dim ** -0.5
    if kind == "array":  # random visibility, each row seeing at least its own position
        seen = mx.random.bernoulli(0.6, (batch, 1, rows, past + rows), key=mx.random.key(seed + 2))
        own = mx.arange(past + rows)[None] == (mx.arange(rows)[:, None] + past)
        mask = seen | own
        got, want = fused(q, k, v, scale, False, mask), mx.fast.scaled_dot_product_attention(q, k, v, scale=scale,
                                                                                             mask=mask)
    else:
        causal = kind == "causal"
        got = fused(q, k, v, scale, causal)
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal" if causal else None)
    assert got.shape == (batch, rows, kv_heads * group * dim)
    assert mx.allclose(got, merged(want), rtol=1e-4, atol=1e-5).item()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16), st.integers(2, 16), st.integers(0, 120), st.sampled_from([16, 64]))
def test_each_row_is_bit_for_bit_the_step_at_its_position(seed, rows, past, dim):
    q = mx.random.normal((1, 6, rows, dim), key=mx.random.key(seed))
    k, v = cache_views(mx.random.key(seed + 1), 1, 2, past + rows, dim, 7)
    together = fused(q, k, v, 0.125, True)
    for i in range(rows):
        alone = fused(q[:, :, i:i + 1], k[..., :past + i + 1, :], v[..., :past + i + 1, :], 0.125, True)
        assert mx.array_equal(together[:, i:i + 1], alone).item()


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.integers(2, 6), st.integers(1, 4), st.integers(1, 600), st.sampled_from([16, 64, 72]),
       st.booleans())
def test_a_batch_row_is_bit_for_bit_the_sequence_alone(seed, batch, rows, past, dim, masked):
    """How the cores share the work (by key head, split or not) and the key tiles never change a row:
    mtp_batch's rows equal each sequence's own step, long contexts (many tiles) included."""
    q = mx.random.normal((batch, 6, rows, dim), key=mx.random.key(seed))
    k, v = cache_views(mx.random.key(seed + 1), batch, 2, past + rows, dim, 5)
    mask = None
    if masked:  # left padding of a different length per row, as a batch cache's
        pads = mx.array([(seed + 3 * b) % (past + 1) for b in range(batch)])
        mask = (mx.arange(past + rows)[None, None, None] >= pads[:, None, None, None]) & \
            (mx.arange(past + rows)[None] <= mx.arange(rows)[:, None] + past)[None, None]
    together = fused(q, k, v, 0.125, not masked, mask)
    for b in range(batch):
        own = None if mask is None else mask[b:b + 1]
        alone = fused(q[b:b + 1], k[b:b + 1], v[b:b + 1], 0.125, not masked, own)
        assert mx.array_equal(together[b:b + 1], alone).item()


def test_a_fully_hidden_row_is_zeros_not_nan():
    q = mx.random.normal((1, 2, 2, 16))
    k = v = mx.random.normal((1, 1, 4, 16))
    mask = mx.array([[True, True, False, False], [False, False, False, False]])
    out = fused(q, k, v, 0.25, False, mask)
    assert mx.array_equal(out[0, 1], mx.zeros((32,))).item() and not mx.isnan(out).any().item()


def test_bad_inputs_are_refused():
    q, k = mx.random.normal((1, 3, 2, 16)), mx.random.normal((1, 2, 4, 16))
    with pytest.raises(ValueError):
        fused(q, k, k, 0.25, True)  # 3 query heads over 2 key heads
    with pytest.raises(ValueError):
        fused(q.astype(mx.float16), k[:, :1], k[:, :1], 0.25, True)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.integers(1, 40), min_size=1, max_size=3), st.floats(0.1, 30.0))
def test_swiglu_matches_mlx(seed, shape, spread):
    gate = mx.random.normal(shape, key=mx.random.key(seed)) * spread
    up = mx.random.normal(shape, key=mx.random.key(seed + 1))
    got, want = rows_matmul.load().swiglu(gate, up), nn.silu(gate) * up
    assert got.shape == want.shape and mx.allclose(got, want, rtol=1e-5, atol=1e-6).item()


def test_swiglu_at_the_ends_of_the_range():
    gate = mx.array([-1e4, -200.0, -88.0, -1e-8, 0.0, 1e-8, 88.0, 200.0, 1e4])
    got = rows_matmul.load().swiglu(gate, mx.ones_like(gate))
    assert mx.allclose(got, nn.silu(gate), rtol=1e-6, atol=1e-30).item() and not mx.isnan(got).any().item()


def test_swiglu_rows_are_bit_for_bit_alone():
    gate, up = mx.random.normal((1, 5, 1536)), mx.random.normal((1, 5, 1536))
    together = rows_matmul.load().swiglu(gate, up)
    for i in range(5):
        assert mx.array_equal(together[:, i], rows_matmul.load().swiglu(gate[:, i], up[:, i])).item()


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 6), st.integers(1, 70), st.sampled_from(["split", "transposed"]))
def test_swiglu_reads_strided_rows_and_each_is_its_row_alone(seed, rows, width, layout):
    """A split of one product's outputs (the stacked gate and up of kernels/compiled_blocks.py) hands it
    rows with a stride; a transposed input has no contiguous rows at all."""
    both = mx.random.normal((1, rows, 2 * width), key=mx.random.key(seed)) * 4
    gate, up = both[..., :width], both[..., width:]
    if layout == "transposed":
        gate, up = [mx.random.normal((width, rows), key=mx.random.key(seed + i)).T[None] for i in (1, 2)]
    got = rows_matmul.load().swiglu(gate, up)
    assert mx.allclose(got, nn.silu(gate) * up, rtol=1e-5, atol=1e-6).item()
    for i in range(rows):
        alone = rows_matmul.load().swiglu(mx.array(gate[:, i]), mx.array(up[:, i]))
        assert mx.array_equal(got[:, i], alone).item()


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.integers(1, compiled_blocks.MAX_ROWS), min_size=1, max_size=5),
       st.integers(1, 30))
def test_compiled_layers_with_it_give_the_stock_logits_within_tolerance(seed, steps, prompt):
    shape = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    stock, mine = tiny_llama(seed=seed, **shape), tiny_llama(seed=seed, **shape)
    assert compiled_blocks.install(mine) == len(mine.model.layers) and compiled_blocks.fused(mine)
    caches = make_prompt_cache(stock), make_prompt_cache(mine)
    tokens = [mx.array([[(seed + 7 * i) % 100 + 1 for i in range(prompt)]])]
    tokens += [mx.array([[(seed + r) % 90 + 2 for r in range(rows)]]) for rows in steps]
    for step in tokens:
        assert mx.allclose(mine(step, cache=caches[1]), stock(step, cache=caches[0]), rtol=1e-4, atol=1e-4).item()


def test_a_left_padded_batch_cache_takes_its_mask():
    stock, mine = tiny_llama(seed=3), tiny_llama(seed=3)
    compiled_blocks.install(mine)
    rows = mx.array([[0, 0, 5, 9, 14, 3], [8, 2, 6, 1, 7, 4]])
    caches = [[BatchKVCache([2, 0]) for _ in m.model.layers] for m in (stock, mine)]
    for step in (rows, mx.array([[11], [12]]), mx.array([[3, 4, 5], [6, 7, 8]])):
        got, want = mine(step, cache=caches[1]), stock(step, cache=caches[0])
        real = slice(2, None) if step is rows else slice(None)  # a padding row sees nothing: its logits are moot
        assert mx.allclose(got[:1, real], want[:1, real], rtol=1e-4, atol=1e-4).item()
        assert mx.allclose(got[1:], want[1:], rtol=1e-4, atol=1e-4).item()


def test_a_mask_of_another_shape_takes_mlx_attention():
    model = tiny_llama(seed=4)
    compiled_blocks.install(model)
    block, cache = model.model.layers[0], make_prompt_cache(model)[0]
    q, k = mx.random.normal((1, 4, 2, 8)), mx.random.normal((1, 2, 6, 8))
    mask = mx.ones((2, 7), dtype=mx.bool_)[:, 1:]  # right rows, a wider window's columns cut by the caller
    wide = mx.ones((2, 9), dtype=mx.bool_)  # not [rows, keys]: the fused kernel must not take it
    want = merged(mx.fast.scaled_dot_product_attention(q, k, k, scale=block.self_attn.scale, mask=mask))
    assert mx.allclose(compiled_blocks._attention(block, q, k, k, cache, mask), want, atol=1e-5).item()
    with pytest.raises(ValueError):  # mlx-lm's attention refuses it, as it would without the kernel
        mx.eval(compiled_blocks._attention(block, q, k, k, cache, wide))
