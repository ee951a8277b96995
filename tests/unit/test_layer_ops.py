"""The fused small ops of a decode step (kernels/rows_matmul/layer_ops.cpp): the RMS norm (with the
residual add before it), the heads' split with the rotary embedding, and the SwiGLU of a stacked gate
and up product match MLX's ops within float tolerance on random shapes, offsets and strided inputs;
each row is bit for bit the same whatever rows came with it (a verify row is the plain step at its
position); bad inputs are refused."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import rows_matmul

pytestmark = pytest.mark.skipif(not rows_matmul.available(), reason=f"rows kernel {rows_matmul.status()}")


def ops():
    return rows_matmul.load()


def angles(dims: int, base: float, scale: float = 1.0) -> mx.array:
    half = dims // 2
    return mx.exp(-mx.arange(half, dtype=mx.float32) * (math.log(base) / half)) * scale


def heads(x: mx.array, count: int) -> mx.array:
    batch, rows, _ = x.shape
    return x.reshape(batch, rows, count, -1).transpose(0, 2, 1, 3)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 3), st.integers(1, 16), st.integers(1, 600), st.booleans())
def test_rms_norm_matches_mlx(seed, batch, rows, width, strided):
    key = mx.random.key(seed)
    x = mx.random.normal((batch, rows, 2 * width), key=key) * 3
    x = x[..., ::2] if strided else x[..., :width]  # a view: rows read in place or gathered
    weight = mx.random.normal((width,), key=mx.random.key(seed + 1))
    r = mx.random.normal(x.shape, key=mx.random.key(seed + 2))
    assert mx.allclose(ops().rms_norm(x, weight, 1e-5), mx.fast.rms_norm(x, weight, 1e-5), rtol=1e-5, atol=1e-5).item()
    h, normed = ops().add_rms_norm(x, r, weight, 1e-6)
    assert mx.array_equal(h, x + r).item()
    assert mx.allclose(normed, mx.fast.rms_norm(x + r, weight, 1e-6), rtol=1e-5, atol=1e-5).item()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 3), st.integers(1, 16), st.sampled_from([(4, 2), (9, 3), (2, 2)]),
       st.sampled_from([8, 32, 64]), st.sampled_from([1.0, 0.5]), st.booleans(), st.booleans(),
       st.sampled_from(["scalar", "per row", "int64"]))
def test_heads_rope_matches_mlx_rope(seed, batch, rows, head_counts, dim, part, traditional, stacked, offsets):
    q_heads, kv_heads = head_counts
    dims = int(dim * part)
    key = mx.random.key(seed)
    whole = mx.random.normal((batch, rows, (q_heads + 2 * kv_heads) * dim), key=key)
    if stacked:  # one product's outputs: given whole, or split (strided rows)
        q, k, v = mx.split(whole, [q_heads * dim, (q_heads + kv_heads) * dim], axis=-1)
    else:
        q, k, v = (mx.random.normal((batch, rows, n * dim), key=mx.random.key(seed + i))
                   for i, n in enumerate((q_heads, kv_heads, kv_heads)))
    starts = [(seed + 97 * b) % 3000 for b in range(batch)]
    offset = {"scalar": mx.array(starts[0]), "per row": mx.array(starts),
              "int64": mx.array(starts, dtype=mx.int64)}[offsets]
    rope = nn.RoPE(dims, traditional=traditional, base=10000.0)
    given = [whole] if stacked and seed % 2 else [q, k, v]
    got = ops().heads_rope(given, offset, angles(dims, 10000.0), q_heads, kv_heads, traditional)
    position = offset if offset.ndim == 0 else offset.astype(mx.int32)
    want = [rope(heads(q, q_heads), offset=position), rope(heads(k, kv_heads), offset=position), heads(v, kv_heads)]
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and mx.allclose(a, b, rtol=1e-4, atol=2e-4).item()


def test_each_row_is_bit_for_bit_the_row_alone_at_its_position():
    q, k, v = mx.random.normal((1, 6, 9 * 64)), mx.random.normal((1, 6, 3 * 64)), mx.random.normal((1, 6, 3 * 64))
    weight, inv_freq = mx.random.normal((9 * 64,)), angles(64, 100000.0)
    together = ops().heads_rope([q, k, v], mx.array(500), inv_freq, 9, 3, False)
    normed = ops().rms_norm(q, weight, 1e-5)
    h, added = ops().add_rms_norm(q, q * 0.5, weight, 1e-5)
    for i in range(6):
        row = slice(i, i + 1)
        alone = ops().heads_rope([q[:, row], k[:, row], v[:, row]], mx.array(500 + i), inv_freq, 9, 3, False)
        for a, b in zip(together, alone, strict=True):
            assert mx.array_equal(a[:, :, row], b).item()
        assert mx.array_equal(normed[:, row], ops().rms_norm(q[:, row], weight, 1e-5)).item()
        assert mx.array_equal(added[:, row], ops().add_rms_norm(q[:, row], q[:, row] * 0.5, weight, 1e-5)[1]).item()


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 6), st.integers(1, 70))
def test_swiglu_of_a_stacked_gate_and_up_is_the_swiglu_of_its_halves(seed, rows, width):
    both = mx.random.normal((1, rows, 2 * width), key=mx.random.key(seed)) * 4
    got = ops().swiglu(both)
    assert mx.array_equal(got, ops().swiglu(both[..., :width], both[..., width:])).item()
    assert mx.allclose(got, nn.silu(both[..., :width]) * both[..., width:], rtol=1e-5, atol=1e-6).item()


def test_bad_inputs_are_refused():
    x, w = mx.random.normal((1, 2, 8)), mx.ones((8,))
    with pytest.raises(ValueError):
        ops().rms_norm(x, mx.ones((7,)), 1e-5)
    with pytest.raises(ValueError):
        ops().add_rms_norm(x, x[..., :4], w, 1e-5)
    q, k = mx.random.normal((1, 2, 4 * 8)), mx.random.normal((1, 2, 2 * 8))
    with pytest.raises(ValueError):
        ops().heads_rope([q, k, k], mx.array(0), angles(8, 1e4), 3, 2, False)  # 32 values are not 3 heads
    with pytest.raises(ValueError):
        ops().heads_rope([q, k, k], mx.array([0, 1, 2]), angles(8, 1e4), 4, 2, False)  # 3 offsets, batch of 1
    with pytest.raises(ValueError):
        ops().heads_rope([q, k, k], mx.array(0), angles(32, 1e4), 4, 2, False)  # more angles than a head holds
    with pytest.raises(ValueError):
        ops().swiglu(mx.ones((2, 7)))  # a stack of odd width
