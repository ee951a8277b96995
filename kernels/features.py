"""What an MTP head reads from the target's forward: its final hidden state, alone or fused with the
outputs of chosen decoder layers (EAGLE-3's low, middle and top features).

`body(model, tokens, cache, layers)` returns (hidden, features): `hidden` is the final normed hidden
state the LM head reads; `features` is `hidden` itself for a last-layer head, else
concat(output of each chosen layer, hidden) on the last axis. With chosen layers it runs the
target's embedding, mask, decoder layers and final norm itself, the same modules in the same order
as mlx-lm's forward, so the logits are bit-identical and no second forward is needed.

`FeatureFusion` is the head's side: per-layer RMSNorm on the chosen layers' outputs, then one
projection of the concatenation (with `hidden`) back to the model width. It starts as a pass-through
of `hidden` (`pass_through`), so a fused head starts as the last-layer head it is initialised from.
"""

from __future__ import annotations

from collections.abc import Sequence

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.base import create_attention_mask


def body(model, tokens: mx.array, cache, layers: Sequence[int] = ()) -> tuple[mx.array, mx.array]:
    """(final normed hidden [B, L, d], drafter features [B, L, (1 + len(layers)) * d])."""
    inner = model.model
    if not layers:
        hidden = inner(tokens, cache=cache)
        return hidden, hidden
    cache = cache if cache is not None else [None] * len(inner.layers)
    h = inner.embed_tokens(tokens)
    # As mlx-lm's LlamaModel: one mask for full attention, one for sliding-window layers if any.
    full = create_attention_mask(h, cache[inner.fa_idx])
    swa_idx = getattr(inner, "swa_idx", None)
    window = create_attention_mask(h, cache[swa_idx], window_size=inner.sliding_window) if swa_idx is not None else None
    kept, wanted = [], set(layers)
    for index, (layer, layer_cache) in enumerate(zip(inner.layers, cache)):
        h = layer(h, window if layer.use_sliding else full, cache=layer_cache)
        if index in wanted:
            kept.append(h)
    hidden = inner.norm(h)
    return hidden, mx.concatenate([*kept, hidden], axis=-1)


def check_layers(model, layers: Sequence[int]) -> None:
    """Raise if `body` cannot give these layers for this model (its forward is not llama's shape)."""
    if reason := layers_misfit(model, layers):
        raise ValueError(reason)


def layers_misfit(model, layers: Sequence[int]) -> str | None:
    """Why `body` cannot give these layers for this model as loaded (None: it can). A rank of a
    pipeline-split model holds only its own layers, so a fused head cannot be fed there."""
    if not layers:
        return None
    from mlx_lm.models.llama import LlamaModel

    inner = model.model
    if not isinstance(inner, LlamaModel):
        return (f"a head fed by decoder layers {list(layers)} needs a llama-shaped model, "
                f"not {type(inner).__module__}")
    if list(layers) != sorted(set(layers)) or layers[0] < 0 or layers[-1] >= len(inner.layers):
        return f"feature layers {list(layers)} must be distinct, ascending and below {len(inner.layers)}"
    return None


def select(extra: np.ndarray, stored: Sequence[int], wanted: Sequence[int], dim: int) -> np.ndarray:
    """Of the outputs of layers `stored` ([T, len(stored) * dim], as mtp_data keeps them), those of
    layers `wanted`, in order: [T, len(wanted) * dim]."""
    missing = set(wanted) - set(stored)
    if missing:
        raise ValueError(f"the data holds layers {list(stored)}; the head needs {sorted(missing)} too")
    blocks = [list(stored).index(layer) for layer in wanted]
    return np.concatenate([extra[:, b * dim:(b + 1) * dim] for b in blocks], axis=1)


class FeatureFusion(nn.Module):
    def __init__(self, dim: int, layers: int, eps: float):
        super().__init__()
        self.norms = [nn.RMSNorm(dim, eps=eps) for _ in range(layers)]
        self.fc = nn.Linear((layers + 1) * dim, dim, bias=False)

    def __call__(self, features: mx.array) -> mx.array:
        parts = mx.split(features, len(self.norms) + 1, axis=-1)
        # The final hidden is normed already; the raw residual streams of lower layers are not.
        normed = [norm(part) for norm, part in zip(self.norms, parts)] + [parts[-1]]
        return self.fc(mx.concatenate(normed, axis=-1))

    def pass_through(self) -> None:
        """fc = [0 ... 0 I]: the output is the final hidden, as a last-layer head reads it."""
        dim = self.fc.weight.shape[0]
        zeros = mx.zeros((dim, len(self.norms) * dim), self.fc.weight.dtype)
        self.fc.weight = mx.concatenate([zeros, mx.eye(dim, dtype=self.fc.weight.dtype)], axis=1)
