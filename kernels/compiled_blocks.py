"""A decoder layer's work around its KV cache as two compiled MLX graphs, for decode and verify steps.

A plain step of the default model runs ~900 MLX ops, most of them small (norms, reshapes, RoPE,
residual adds), and building and dispatching them one by one from Python cost about as much as
reading the weights (README, "What a step costs"). Each llama decoder layer here runs as:
`before` (input norm, q/k/v products, head split, RoPE at the cache's offset) and `after` (o
product of the merged heads, residual, post norm, MLP, residual), each an `mx.compile`d graph, with
the cache update (mlx-lm's, so every cache type works) and the attention between them. Measured on a
2-core AMD EPYC (paired step by step with the stock layer, rows kernel on): a plain step 0.84x,
verify of 2, 3, 5 and 8 rows 0.91x, 0.91x, 0.93x and 0.95x, with logits bit-identical.

The attention is the fused few-rows kernel (kernels/rows_matmul/attention.cpp) where the layers were
installed with it (no mask, causal, or a boolean mask; float32, unquantized cache), else mlx-lm's;
so is the MLP's SwiGLU (activation.cpp). They are not bit-identical to mlx-lm's ops (within float
tolerance), but each row is computed alone, the same whatever rows came with it, so a verify row
still equals the plain step at its position. Where the rows kernel runs the products, q, k and v
are one product by their stacked weights, and so are the MLP's gate and up
(kernels/stacked_products.py): 4 kernel calls a layer in place of 7, the logits keeping every bit.

With the fused kernels, the small ops are one graph node each too (kernels/rows_matmul/layer_ops.cpp):
on MLX's CPU backend mx.fast.rms_norm and mx.fast.rope run as their decompositions (3 and ~12 nodes).
A layer is then: the input norm, the stacked q/k/v product, the heads' split with RoPE (reading the
stacked output in place), the cache's two row writes, the attention over the cache's buffers read in
place up to its length, the o product, the residual add with the post norm, the stacked gate/up
product, the SwiGLU of it, and the down product adding the residual: 11 nodes where MLX's ops took
~50 (a default-model step 345 nodes, not 1,545).

Compiled graphs are traced once per input shape, so only steps of at most MAX_ROWS rows per
sequence at a cache's offset take them (decode, verify); prefill chunks and a forward without a cache
run the stock layer. A draft tree's per-token positions (kernels/tree_verify.py) run the same two
parts op by op (a new shape each time) around the same attention, so a tree's nodes attend as a
chain's rows do. A trace keeps the weights and the product path (kernels/rows_matmul.py) of its time:
swapping the rows kernel in or out bumps `rows_matmul.swaps`, and the layers trace again.
"""

from __future__ import annotations

import math
import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import BatchKVCache, KVCache
from mlx_lm.models.llama import TransformerBlock

from kernels import rows_matmul
from kernels.stacked_products import products, stack_products, stacked_product
from kernels.mtp_head import MTPBlock
from kernels.tree_verify import PositionedRope, Positions

MAX_ROWS = 16  # rows per sequence a compiled step takes; more (a prefill chunk) runs the stock layer
# Graphs traced so far in this process: a compiled part's Python body runs only when it traces (a new
# shape), so a step that moved this paid a one-time cost, not its shape's (the owner's replies carry it).
traces = 0


class CompiledBlock(TransformerBlock):
    """A llama TransformerBlock whose work before and after the cache runs compiled (install swaps the
    class of each layer in place, so its parameters, names and checkpoints are unchanged)."""

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        if cache is None or x.shape[1] > MAX_ROWS:  # no cache, a prefill chunk
            return super().__call__(x, mask, cache)
        if isinstance(getattr(cache, "offset", None), Positions):  # a draft tree's: a new shape each, so op by op
            return _around_cache(self, _parts(self), x, cache.offset, mask, cache)
        offset = _offset(x, cache)
        if offset is None:
            return super().__call__(x, mask, cache)
        return _around_cache(self, _graphs(self), x, offset, mask, cache)


class CompiledMTPBlock(MTPBlock):
    """An MTP head's block (kernels/mtp_head.py, the same parameter names) compiled the same way for
    serving drafts; training's stand-in cache and gated or qk-normed attention run it stock."""

    def __call__(self, x: mx.array, mask, cache) -> mx.array:
        attn = self.self_attn
        offset = _offset(x, cache) if type(cache) is KVCache and not attn.gated and "q_norm" not in attn else None
        if offset is None:
            return super().__call__(x, mask, cache)
        return _around_cache(self, _graphs(self), x, offset, mask, cache)


def _offset(x: mx.array, cache) -> mx.array | None:
    """The cache's offset as an array, or None where the stock layer must run."""
    offset = getattr(cache, "offset", None)
    offset = mx.array(offset) if isinstance(offset, int) else offset
    return offset if isinstance(offset, mx.array) and x.shape[1] <= MAX_ROWS else None


def _around_cache(block, parts, x: mx.array, offset, mask, cache) -> mx.array:
    before, after = parts
    queries, keys, values = before(x, offset)
    keys, values = cache.update_and_fetch(keys, values)
    # mlx-lm's plain and batch KV caches hand out prefixes of their buffers: the fused attention reads
    # the buffers in place up to that length, so those views are never evaluated (no graph nodes).
    buffers = (cache.keys, cache.values) if type(cache) in (KVCache, BatchKVCache) else None
    return after(x, _attention(block, queries, keys, values, cache, mask, buffers))


def _attention(block, queries: mx.array, keys: mx.array, values: mx.array, cache, mask, buffers=None) -> mx.array:
    """Attention with its heads merged ([B, L, H * D]): the fused few-rows kernel
    (kernels/rows_matmul/attention.cpp) where the layer was installed with it and it takes this step
    (float32, an unquantized cache, no mask, causal, or a boolean mask), else mlx-lm's. buffers: the
    cache's (keys, values) buffers that keys and values are prefixes of, which the kernel reads instead."""
    length = keys.shape[2]
    taken = _fused_attention_mask(queries, keys, mask, length) if _fused_kernels(block) is not None and \
        not hasattr(cache, "bits") else None
    if taken is None:
        output = scaled_dot_product_attention(queries, keys, values, cache=cache, scale=block.self_attn.scale,
                                              mask=mask)
        batch, _, rows, _ = output.shape
        return output.transpose(0, 2, 1, 3).reshape(batch, rows, -1)
    keys, values = buffers or (keys, values)
    return _fused_kernels(block).few_rows_attention(queries, keys, values, block.self_attn.scale, *taken, length)


def _fused_attention_mask(queries: mx.array, keys: mx.array, mask, length: int):
    """How the fused attention takes this mask over `length` keys: (causal, boolean mask or None), or None
    where it cannot (not float32, an additive mask, a mask of another shape such as a window's)."""
    if queries.dtype != mx.float32 or keys.dtype != mx.float32:
        return None
    if mask is None or (isinstance(mask, str) and mask == "causal"):
        return mask is not None, None
    fits = isinstance(mask, mx.array) and mask.dtype == mx.bool_ and mask.ndim <= 4
    return (False, mask) if fits and mask.shape[-2:] == (queries.shape[2], length) else None


def _mlp(block, x: mx.array, residual: mx.array | None = None) -> mx.array:
    """The block's MLP (llama's, or the MTP head's of the same form: down(silu(gate x) * up x)), plus the
    residual where one is given, its SwiGLU on the fused kernel (kernels/rows_matmul/activation.cpp)
    where the layer was installed with it; there the stacked gate and up product goes to the SwiGLU
    whole, and the residual is added by the down product's kernel call (the same rounding, one node)."""
    mlp = block.mlp
    fused = _fused_kernels(block)
    if fused is None or x.dtype != mx.float32:
        return mlp(x) if residual is None else residual + mlp(x)
    stacked = stacked_product(block, "gate_up", x, (mlp.gate_proj, mlp.up_proj))
    activated = fused.swiglu(stacked) if stacked is not None else fused.swiglu(mlp.gate_proj(x), mlp.up_proj(x))
    down = mlp.down_proj
    if residual is not None and type(down) is rows_matmul.RowsLinear:
        return down.product(activated, residual)
    return down(activated) if residual is None else residual + down(activated)


def _fused_kernels(block):
    """The kernels' module where the layer was installed with the fused kernels, else None."""
    return rows_matmul.load() if getattr(block, "_fused", False) else None


def _graphs(block):
    graphs = getattr(block, "_compiled", None)
    if graphs is None or graphs[0] != rows_matmul.swaps:
        graphs = (rows_matmul.swaps, *(mx.compile(_counted(part)) for part in _parts(block)))
        object.__setattr__(block, "_compiled", graphs)  # a plain attribute: not a parameter
    return graphs[1:]


def _counted(part):
    """part, counting its calls in `traces`: compiled, it is called only to trace."""

    def counted(*args):
        global traces
        traces += 1
        return part(*args)

    return counted


def _parts(block: TransformerBlock):
    """The layer's work before and after its cache, as plain functions (compiled by _graphs)."""
    attn = block.self_attn

    def before(x: mx.array, offset: mx.array):
        fused, angles = _fused_kernels(block), _rope_angles(block, offset)
        if fused is not None and angles is not None and _fused_norms(block, x):
            norm = block.input_layernorm
            normed = fused.rms_norm(x, norm.weight, norm.eps)
            projections = (attn.q_proj, attn.k_proj, attn.v_proj)
            stacked = stacked_product(block, "qkv", normed, projections)  # split by the kernel: no node
            qkv = [stacked] if stacked is not None else [p(normed) for p in projections]
            return tuple(fused.heads_rope(qkv, offset, angles, attn.n_heads, attn.n_kv_heads, _rope(attn).traditional))
        batch, rows, _ = x.shape
        h = block.input_layernorm(x)
        q, k, v = products(block, "qkv", h, (attn.q_proj, attn.k_proj, attn.v_proj))
        q = q.reshape(batch, rows, attn.n_heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(batch, rows, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = v.reshape(batch, rows, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        return attn.rope(q, offset=offset), attn.rope(k, offset=offset), v

    def after(x: mx.array, output: mx.array):
        fused = _fused_kernels(block)
        if fused is not None and _fused_norms(block, x):
            norm = block.post_attention_layernorm
            h, normed = fused.add_rms_norm(x, attn.o_proj(output), norm.weight, norm.eps)
            return _mlp(block, normed, residual=h)
        h = x + attn.o_proj(output)
        return h + _mlp(block, block.post_attention_layernorm(h))

    return before, after


def _fused_norms(block, x: mx.array) -> bool:
    """Whether the fused kernels take the layer's norms (each one node, not MLX's three on the CPU)."""
    norms = (block.input_layernorm, block.post_attention_layernorm)
    return x.dtype == mx.float32 and all(type(n) is nn.RMSNorm and n.weight.dtype == mx.float32 for n in norms)


def _rope(attn):
    rope = attn.rope
    return rope.inner if isinstance(rope, PositionedRope) else rope  # a tree's wrapper: the same RoPE


def _rope_angles(block, offset) -> mx.array | None:
    """The fused heads_rope's angle per position for each rotated pair (MLX's fast.rope's, to the
    last bit or so: exp(-i log(base) / half) * scale), where the layer's RoPE is mlx's plain one and
    positions run on from an offset (a tree's per-token positions do not); else None."""
    rope = _rope(block.self_attn)
    if type(rope) is not nn.RoPE or not isinstance(offset, mx.array):
        return None
    key = (rope.dims, rope.base, rope.scale)
    cached = getattr(block, "_rope_inv_freq", None)
    if cached is None or cached[0] != key:
        half = rope.dims // 2
        angles = mx.exp(-mx.arange(half, dtype=mx.float32) * (math.log(rope.base) / half)) * rope.scale
        mx.eval(angles)
        cached = (key, angles)
        object.__setattr__(block, "_rope_inv_freq", cached)  # a plain attribute: not a parameter
    return cached[1]


def install(model: nn.Module, fused_kernels: bool = True) -> int:
    """Compile the target's llama decoder layers (no other kind of layer is touched), their attention
    and SwiGLU fused where fused_kernels and the kernels build here; how many."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    return sum(_swap_in(layer, (TransformerBlock, CompiledBlock), CompiledBlock, fused_kernels) for layer in layers)


def install_head(head: nn.Module, fused_kernels: bool = True) -> int:
    """Compile an MTP head's blocks for serving (its weights fixed from here on); how many."""
    layers = getattr(head, "layers", None) or []
    return sum(_swap_in(layer, (MTPBlock, CompiledMTPBlock), CompiledMTPBlock, fused_kernels) for layer in layers)


def _swap_in(layer, kinds: tuple[type, ...], compiled: type, fused_kernels: bool) -> bool:
    if type(layer) not in kinds:
        return False
    layer.__class__ = compiled
    object.__setattr__(layer, "_compiled", None)
    object.__setattr__(layer, "_fused", fused_kernels and rows_matmul.available())
    stack_products(layer)
    return True


def fused(model: nn.Module) -> bool:
    """Whether the model's compiled layers run the fused kernels."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    return any(getattr(layer, "_fused", False) for layer in layers if type(layer) is CompiledBlock)


def uninstall(model: nn.Module) -> None:
    for layer in getattr(getattr(model, "model", None), "layers", None) or []:
        if type(layer) is CompiledBlock:
            layer.__class__ = TransformerBlock
