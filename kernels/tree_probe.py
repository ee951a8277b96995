"""What a draft tree's verify costs here, in both layouts of kernels/tree_verify.py, against plain
decode and a chain of the same depth: the measurement behind the mask layout's choice.

Cells (at one context length): a plain step, chains of k + m drafts, the mask layout (a spine of k
with m leaves, one row) and the rows layout (w = m + 1 rows of k + 1 tokens over a copy of the
prefix). Each round runs every cell once, in an order rotated per round, and a cell's figure is its
fastest round over the plain step's fastest (the least disturbed by other work on a shared machine)
and the median ratio beside it. Every forward is trimmed back off the cache, so the context stays put.
"""

from __future__ import annotations

import statistics
import time

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx

from kernels.loader import load, output_head
from kernels.tree import spine_with_leaves
from kernels.tree_verify import Positions, TreeCache, _row_copy, _wrap_ropes, tree_mask


def layout_costs(model_dir, contexts=(150, 700), k: int = 3, extra=(1, 2, 3), rounds: int = 10) -> list[dict]:
    """One dict per (context, cell): cell name, min ratio and median ratio to a plain step, plain ms."""
    from kernels.engine import Engine

    model = load(model_dir).model
    engine = Engine(model)
    _wrap_ropes(model)
    out = []
    for context in contexts:
        ids = [(i * 37) % 40000 + 100 for i in range(context)]
        engine.prefill("probe", ids, 0.0, 1.0, None, False)
        state = engine.seqs["probe"]
        cells = _cells(model, state, k, extra)
        for cell in cells.values():  # untimed: build each shape once
            cell()
        times = {name: [] for name in cells}
        names = list(cells)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                started = time.perf_counter()
                cells[name]()
                times[name].append((time.perf_counter() - started) * 1e3)
        fastest, typical = min(times["plain"]), statistics.median(times["plain"])
        out += [{"context": context, "cell": name, "min_ratio": min(t) / fastest,
                 "median_ratio": statistics.median(t) / typical, "plain_ms": fastest}
                for name, t in times.items() if name != "plain"]
        engine.release("probe")
    return out


def _cells(model, state, k: int, extra) -> dict:
    offset = state.length

    def forward(tokens: mx.array, caches) -> None:
        hidden = model.model(tokens, cache=caches)
        mx.eval(mx.argmax(output_head(model)(hidden), axis=-1))

    def chain(n: int):
        def run():
            forward(mx.array([[5] * (n + 1)], dtype=mx.uint32), state.cache)
            for c in state.cache:
                c.trim(n + 1)
        return run

    def masked(m: int):
        tree = spine_with_leaves([5] * k, [(1 + i % k, 7 + i) for i in range(m)])

        def run():
            positions = Positions(mx.array([offset + d for d in tree.depths()]))
            caches = [TreeCache(c, positions, tree_mask(tree, offset)) for c in state.cache]
            forward(mx.array([[5, *tree.tokens]], dtype=mx.uint32), caches)
            for c in state.cache:
                c.trim(tree.size + 1)
        return run

    def rows(w: int):
        def run():
            forward(mx.array([[5] * (k + 1)] * w, dtype=mx.uint32), [_row_copy(c, offset, w) for c in state.cache])
        return run

    cells = {"plain": chain(0), f"chain k={k}": chain(k)}
    for m in extra:
        cells[f"chain k={k + m}"] = chain(k + m)
        cells[f"mask k={k}+{m} leaves"] = masked(m)
        cells[f"rows {m + 1}x{k + 1}"] = rows(m + 1)
    return cells
