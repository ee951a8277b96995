"""Products that read the same input, as one product by their stacked weights: q, k and v, and the
MLP's gate and up, where they are the rows kernel's layers (kernels/rows_matmul.py). A step then runs
4 kernel calls a layer in place of 7, each a call MLX dispatches alone (a step of 1-8 rows of the
default model 1.4-2.6% faster on a 2-core AMD EPYC), and every output is the same dot product as
before, so the logits keep their bits. Each layer's own weight becomes a view into the stack, so the
stack costs no memory."""

from __future__ import annotations

from typing import NamedTuple

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx

from kernels import rows_matmul


class Stacked(NamedTuple):
    """Weights of products that read the same input, stacked on the output axis; each layer's own
    weight is a view into it (`parts`), so the stack costs no memory."""

    weight: mx.array
    parts: tuple[mx.array, ...]
    splits: tuple[int, ...]  # where each part's outputs start, after the first
    half: tuple | None  # rows_matmul.halved(weight): the float16 copy the kernel reads, where exact


def stack_products(layer) -> None:
    """Stack q, k and v, and the MLP's gate and up, where they are the rows kernel's layers. A stack
    already made stays (a reinstall keeps it)."""
    attn, mlp = layer.self_attn, layer.mlp
    stacks = getattr(layer, "_stacks", None) or {}
    for name, parts in (("qkv", (attn.q_proj, attn.k_proj, attn.v_proj)), ("gate_up", (mlp.gate_proj, mlp.up_proj))):
        if _fresh(stacks.get(name), parts) or not _stackable(parts):
            continue
        weight = mx.concatenate([p.weight for p in parts])
        half = rows_matmul.stacked_half(weight, parts)
        mx.eval(weight)
        sizes = [p.weight.shape[0] for p in parts]
        starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        for p, a, b in zip(parts, starts, starts[1:]):
            p.weight = weight[a:b]  # a view: the separate weight is freed
            p.forget_half()  # and its float16 copy: the stack has one
        mx.eval([p.weight for p in parts])
        stacks[name] = Stacked(weight, tuple(p.weight for p in parts), tuple(starts[1:-1]), half)
    object.__setattr__(layer, "_stacks", stacks)


def _stackable(parts) -> bool:
    weights = [getattr(p, "weight", None) for p in parts]
    return all(type(p) is rows_matmul.RowsLinear for p in parts) and \
        len({(w.shape[1], w.dtype) for w in weights}) == 1 and weights[0].dtype == mx.float32


def _fresh(stack: Stacked | None, parts) -> bool:
    """Whether the stack still holds these layers' weights (none was swapped or loaded since)."""
    return stack is not None and all(type(p) is rows_matmul.RowsLinear and p.weight is w
                                     for p, w in zip(parts, stack.parts))


def products(block, name: str, x: mx.array, parts) -> list[mx.array]:
    """Each layer's product of x: one kernel call by their stack where it is fresh and the kernel takes
    these rows, else one call each (the stock path keeps its own products, bit for bit)."""
    stacked = stacked_product(block, name, x, parts)
    if stacked is None:
        return [p(x) for p in parts]
    return mx.split(stacked, list(block._stacks[name].splits), axis=-1)


def stacked_product(block, name: str, x: mx.array, parts) -> mx.array | None:
    """x by the named stack of the block's weights (the parts' outputs side by side), where it is fresh
    and the kernel takes these rows; else None."""
    stack = (getattr(block, "_stacks", None) or {}).get(name)
    if not _fresh(stack, parts) or not rows_matmul.takes(x, stack.weight):
        return None
    return rows_matmul.product(x, stack.weight, half=stack.half)
