"""The ragged rollback's realignment (kernels/rows_matmul/realign.cpp via kernels/batch_engine.realign):
every row's entries where mlx-lm's roll puts them, offsets and left padding as it sets them, on random
shapes and shifts; a buffer someone else still holds is left untouched; without the extension the
stock roll runs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import BatchKVCache

from kernels import rows_matmul
from kernels.batch_engine import realign


def filled(seed: int, batch: int, heads: int, capacity: int, end: int, dim: int, pads: list[int]) -> BatchKVCache:
    cache = BatchKVCache(pads)
    k1, k2 = mx.random.split(mx.random.key(seed))
    cache.keys = mx.random.normal((batch, heads, capacity, dim), key=k1)
    cache.values = mx.random.normal((batch, heads, capacity, dim), key=k2)
    cache._idx = end
    cache.offset = mx.array([end - p for p in pads])
    mx.eval(cache.keys, cache.values)
    return cache


def twin(cache: BatchKVCache) -> BatchKVCache:
    other = BatchKVCache([0] * cache.keys.shape[0])
    other.keys, other.values = mx.array(cache.keys), mx.array(cache.values)
    other._idx = cache._idx
    other.offset, other.left_padding = mx.array(cache.offset), mx.array(cache.left_padding)  # finalize adds in place
    return other


def assert_same_rows(stock: BatchKVCache, ours: BatchKVCache) -> None:
    assert ours.offset.tolist() == stock.offset.tolist()
    assert ours.left_padding.tolist() == stock.left_padding.tolist()
    for name in ("keys", "values"):
        a, b = np.array(getattr(stock, name)), np.array(getattr(ours, name))
        for row, start in enumerate(stock.left_padding.tolist()):  # the padding in front is masked
            np.testing.assert_array_equal(b[row, :, start:stock._idx], a[row, :, start:stock._idx])


cases = st.integers(1, 5).flatmap(lambda batch: st.tuples(
    st.just(batch), st.integers(1, 4), st.integers(1, 64), st.integers(0, 40), st.sampled_from([4, 16, 64]),
    st.lists(st.integers(0, 8), min_size=batch, max_size=batch), st.lists(st.integers(0, 6), min_size=batch,
                                                                          max_size=batch)))


@pytest.mark.skipif(not rows_matmul.available(), reason=f"rows kernel {rows_matmul.status()}")
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**16), cases)
def test_it_puts_every_row_where_the_stock_roll_does(seed, case):
    batch, heads, end, room, dim, shifts, pads = case
    end = max(end, max(shifts) + max(pads))  # a row sheds at most what it holds past its padding
    stock = filled(seed, batch, heads, end + room, end, dim, pads)
    ours = twin(stock)
    stock.prepare(right_padding=shifts)
    stock.finalize()
    realign(ours, shifts)
    mx.eval(ours.keys, ours.values, stock.keys, stock.values)
    assert_same_rows(stock, ours)


@pytest.mark.skipif(not rows_matmul.available(), reason=f"rows kernel {rows_matmul.status()}")
def test_a_buffer_still_held_elsewhere_is_not_moved():
    cache = filled(3, 3, 2, 40, 30, 16, [0, 0, 0])
    held = cache.keys
    before = np.array(held)
    realign(cache, [2, 0, 1])
    mx.eval(cache.keys, cache.values)
    np.testing.assert_array_equal(np.array(held), before)
    np.testing.assert_array_equal(np.array(cache.keys)[0, :, 2:30], before[0, :, :28])


def test_without_the_extension_the_stock_roll_runs(monkeypatch):
    cache = filled(5, 2, 2, 32, 20, 8, [1, 0])
    stock = twin(cache)
    monkeypatch.setattr(rows_matmul, "load", lambda: None)
    realign(cache, [0, 3])
    stock.prepare(right_padding=[0, 3])
    stock.finalize()
    for name in ("keys", "values"):  # the stock roll itself: the whole buffer alike
        np.testing.assert_array_equal(np.array(getattr(cache, name)), np.array(getattr(stock, name)))
    assert cache.offset.tolist() == stock.offset.tolist()
