"""One target forward over many sequences, each with its own KV cache and its own number of new tokens.

The linear layers run once over all new tokens of the batch (that is where batching pays: the
weights are read once); attention runs per sequence on that sequence's own cache, with exactly the
ops of the single-sequence path. Ragged rollback is then a plain per-sequence trim.
Supports llama-style blocks (input_layernorm, self_attn q/k/v/o_proj + rope, post_attention_layernorm,
mlp), which covers llama, mistral and qwen2 models of mlx-lm.
"""

from __future__ import annotations

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention


def supports_rows(model) -> bool:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers:
        return False
    block = layers[0]
    attn = getattr(block, "self_attn", None)
    return all(hasattr(block, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")) and \
        attn is not None and all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "rope")) and \
        not getattr(block, "use_sliding", False)


def forward_rows(model, rows: list[tuple[mx.array, list]]) -> tuple[list[mx.array], list[mx.array]]:
    """rows: (tokens [L_i], cache) per sequence -> (logits [L_i, V], hidden [L_i, d]) per sequence."""
    inner = model.model
    lengths = [int(tokens.shape[0]) for tokens, _ in rows]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    h = inner.embed_tokens(mx.concatenate([tokens for tokens, _ in rows]))[None]
    for index, layer in enumerate(inner.layers):
        caches = [cache[index] for _, cache in rows]
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), starts, lengths, caches)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    hidden = inner.norm(h)
    logits = model.lm_head(hidden) if getattr(model, "lm_head", None) is not None \
        else inner.embed_tokens.as_linear(hidden)
    split = lambda x: [x[0, s:s + n] for s, n in zip(starts, lengths)]  # noqa: E731
    return split(logits), split(hidden)


def _attention(attn, x: mx.array, starts, lengths, caches) -> mx.array:
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    outputs = []
    for start, length, cache in zip(starts, lengths, caches):
        rows = slice(start, start + length)
        q = queries[:, rows].reshape(1, length, attn.n_heads, -1).transpose(0, 2, 1, 3)
        k = keys[:, rows].reshape(1, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = values[:, rows].reshape(1, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        mask = create_attention_mask(x[:, rows], cache)
        q, k = attn.rope(q, offset=cache.offset), attn.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=attn.scale, mask=mask)
        outputs.append(out.transpose(0, 2, 1, 3).reshape(1, length, -1))
    return attn.o_proj(mx.concatenate(outputs, axis=1))
