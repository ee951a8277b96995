"""A DeepSeek-V3-style multi-token prediction (MTP) head, chained to depth K, with its own KV cache.

One step of the head at sequence position j, fed the pair (h_j, t_{j+1}):
    x    = fc(concat(pre_fc_norm_embedding(embed(t_{j+1})), pre_fc_norm_hidden(h_j)))
    h'_j = norm(block(x))          # one transformer block, causal over the head's own KV cache
    logits = lm_head(h'_j)         # a guess at t_{j+2}
`embed` and `lm_head` are the target's own modules, passed in, never copied; so is the final norm
unless the head carries its own (`own_norm`, as Qwen3-Next / Qwen3.5 checkpoints do). The
concatenation puts the embedding first, as DeepSeek-V3 (eh_proj) and Qwen (mtp.fc) do, so their
projection weights load unchanged. h_j is the target's last hidden state after its final norm,
which is what an mlx-lm `model.model(...)` returns; the head's own output h'_j follows the same
convention, so depth d+1 feeds (h'_j, its own draft) at position j+1, like a decode step.
A fused head (`feature_layers`, EAGLE-3 style) reads, for exact pairs, a projection of chosen decoder
layers' outputs with h_j (kernels/features.py) in place of h_j; its deeper drafts still read h'_j.

Cache discipline: the cache holds one entry per exact pair (target hidden, emitted token) fed so
far. `draft` feeds the new exact pairs, drafts K tokens, then trims its K-1 speculative entries
itself, so a rejected draft leaves nothing behind. When the target's history is cut back, trim
the head's cache by the same count (`mlx_lm.models.cache.trim_prompt_cache`).

Reduced draft vocabulary (optional, `draft_vocab_size`): the target's LM head is most of a draft
step's cost on a CPU (49,152 x 576 for the default model), so a head may carry its own projection
onto the N most frequent tokens (`draft_lm_head`, rows of the target's LM head) and `vocab_map`
(N full-vocabulary ids). Drafts are then mapped back to full ids, and q is scattered into the full
vocabulary (zero outside the map), so callers see no difference; the `lm_head` argument is unused.

Weights on disk: `mtp_head.safetensors` (parameters) and `mtp_head.json` (the MTPConfig fields)
side by side. `kernels.mtp_qwen.load_qwen_mtp_head` reads the `mtp.*` tensors of a raw Hugging Face
Qwen3.5 checkpoint instead (mlx-lm drops them when it loads the model).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

from kernels.features import FeatureFusion
from kernels.sampling import greedy, probs_from_logits, sample, top1_logprob

HEAD_WEIGHTS = "mtp_head.safetensors"
HEAD_CONFIG = "mtp_head.json"
SHIPPED_HEADS = Path(__file__).parent / "heads"  # trained heads shipped as package data

Module = Callable[[mx.array], mx.array]


@dataclass(frozen=True)
class MTPConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    head_dim: int | None = None  # default hidden_size // num_attention_heads
    rope_dims: int | None = None  # partial rotary (Qwen: head_dim / 4); default all of head_dim
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (Qwen)
    gated_attention: bool = False  # q_proj also yields a sigmoid gate on the output (Qwen)
    own_norm: bool = False  # the head has its own final norm instead of the target's
    num_layers: int = 1  # 1 = one block shared by every depth
    draft_vocab_size: int | None = None  # N: draft over N tokens of the target's vocabulary
    vocab_size: int | None = None  # the target's vocabulary size, needed with draft_vocab_size
    # Decoder layers whose outputs are fused with the final hidden state (kernels/features.py);
    # empty: the final hidden state alone, as every head saved before this field.
    feature_layers: tuple[int, ...] = ()

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def feature_width(self) -> int:
        """Width of the target features an exact pair carries."""
        return self.hidden_size * (1 + len(self.feature_layers))


class MTPDraft(NamedTuple):
    ids: list[int]  # K drafted token ids
    logprobs: list[float]  # top-1 log-probability at each depth (temperature 1): confidence
    probs: mx.array | None  # q [K, V] the ids were sampled from; None when drafting greedily


class MTPAttention(nn.Module):
    def __init__(self, cfg: MTPConfig):
        super().__init__()
        head, width = cfg.head_size, cfg.num_attention_heads * cfg.head_size
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.gated, self.scale = cfg.gated_attention, head**-0.5
        self.q_proj = nn.Linear(cfg.hidden_size, width * (2 if self.gated else 1), bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * head, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * head, bias=False)
        self.o_proj = nn.Linear(width, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(head, eps=cfg.rms_norm_eps)
            self.k_norm = nn.RMSNorm(head, eps=cfg.rms_norm_eps)
        self.rope = nn.RoPE(cfg.rope_dims or head, traditional=False, base=cfg.rope_theta)

    def __call__(self, x: mx.array, mask, cache: KVCache) -> mx.array:
        batch, length, _ = x.shape
        q = self.q_proj(x).reshape(batch, length, self.n_heads, -1)
        if self.gated:
            q, gate = mx.split(q, 2, axis=-1)
        k = self.k_proj(x).reshape(batch, length, self.n_kv_heads, -1)
        v = self.v_proj(x).reshape(batch, length, self.n_kv_heads, -1)
        if "q_norm" in self:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        q, k = self.rope(q, offset=cache.offset), self.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        out = out.transpose(0, 2, 1, 3).reshape(batch, length, -1)
        if self.gated:
            out = out * mx.sigmoid(gate.reshape(batch, length, -1))
        return self.o_proj(out)


class MTPMLP(nn.Module):
    def __init__(self, cfg: MTPConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class MTPBlock(nn.Module):
    """A pre-norm transformer block; parameter names match mlx-lm's llama TransformerBlock."""

    def __init__(self, cfg: MTPConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = MTPAttention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = MTPMLP(cfg)

    def __call__(self, x: mx.array, mask, cache: KVCache) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class MTPHead(nn.Module):
    def __init__(self, config: MTPConfig):
        super().__init__()
        if config.num_layers != 1:
            # Per-depth modules would each need a cache lagging the exact prefix by their depth;
            # no checkpoint we load ships more than one (Qwen3.5 and DeepSeek-V3 ship one).
            raise NotImplementedError("only depth-shared MTP heads (num_layers=1) are supported")
        self.config = config
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = nn.RMSNorm(dim, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(dim, eps=eps)
        self.fc = nn.Linear(2 * dim, dim, bias=False)
        if config.feature_layers:
            self.features = FeatureFusion(dim, len(config.feature_layers), eps)
        self.layers = [MTPBlock(config) for _ in range(config.num_layers)]
        if config.own_norm:
            self.norm = nn.RMSNorm(dim, eps=eps)
        if config.draft_vocab_size:
            if not config.vocab_size:
                raise ValueError("a reduced draft vocabulary needs the target's vocab_size")
            self.draft_lm_head = nn.Linear(dim, config.draft_vocab_size, bias=False)
            self.vocab_map = mx.zeros((config.draft_vocab_size,), dtype=mx.int32)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def forward(
        self, hidden: mx.array, tokens: mx.array, embed: Module, final_norm: Module, cache, exact: bool = True
    ) -> mx.array:
        """Pairs (h_j, t_{j+1}) -> the head's normed outputs; tokens [1, L]; hidden [1, L, F]: the
        target's features (exact pairs, F = feature_width) or the head's own outputs (F = d)."""
        x = self.fuse(hidden, tokens, embed, exact)
        x = self.layers[0](x, create_attention_mask(x, cache[0]), cache[0])
        return self.norm(x) if "norm" in self else final_norm(x)

    def fuse(self, hidden: mx.array, tokens: mx.array, embed: Module, exact: bool = True) -> mx.array:
        """The block's input: fc(concat(normed embedding of t_{j+1}, normed h_j)); a fused head's h_j
        of an exact pair is its projection of the target's layers (its own outputs are used as they are)."""
        if exact and "features" in self:
            hidden = self.features(hidden)
        embedded = self.pre_fc_norm_embedding(embed(tokens))
        return self.fc(mx.concatenate([embedded, self.pre_fc_norm_hidden(hidden)], axis=-1))

    def absorb(self, hidden, next_tokens, embed: Module, final_norm: Module, cache) -> None:
        """Feed exact pairs without drafting (after plain decode steps): keeps the cache in step."""
        tokens = _token_rows(next_tokens)
        if tokens.size:
            self.forward(_rows(hidden), tokens, embed, final_norm, cache)
            mx.eval([(c.keys, c.values) for c in cache])

    def draft(
        self,
        hidden: mx.array,
        next_tokens: int | Sequence[int] | mx.array,
        k: int,
        embed: Module,
        final_norm: Module,
        lm_head: Module,
        cache,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        key: mx.array | None = None,
    ) -> MTPDraft:
        """Feed the new exact pairs (hidden [L, d] or [d], next_tokens [L]), then draft k tokens.

        Greedy (argmax) at temperature 0; otherwise each depth samples from
        q = probs_from_logits(logits, temperature, top_p), returned for rejection sampling.
        """
        tokens = _token_rows(next_tokens)
        if k < 1 or tokens.size < 1:
            raise ValueError(f"draft needs k >= 1 and a new pair, got k={k}, {tokens.size} pairs")
        h = self.forward(_rows(hidden), tokens, embed, final_norm, cache)
        h = h[:, -1:, :]
        keys = list(mx.random.split(key, k)) if key is not None else [None] * k
        ids, logprobs, probs = [], [], []
        for depth in range(k):
            logits = self.draft_logits(h, lm_head)[0, 0]
            logprobs.append(top1_logprob(logits))
            if temperature > 0:
                probs.append(self._full_probs(probs_from_logits(logits, temperature, top_p)))
                ids.append(sample(probs[-1], keys[depth]))
            else:
                ids.append(self._full_ids(greedy(logits)))
            if depth + 1 < k:
                h = self.forward(h, ids[-1].reshape(1, 1), embed, final_norm, cache, exact=False)
        # Drop the k-1 speculative positions now: only exact pairs ever stay in the cache.
        for layer_cache in cache:
            layer_cache.trim(k - 1)
        q = mx.stack(probs) if probs else None
        ids_array, logprob_array = mx.stack(ids), mx.stack(logprobs)
        mx.eval(ids_array, logprob_array, *([q] if q is not None else []))
        return MTPDraft(ids_array.tolist(), logprob_array.tolist(), q)


    @property
    def reduced(self) -> bool:
        return "draft_lm_head" in self

    def draft_logits(self, h: mx.array, lm_head: Module) -> mx.array:
        """Logits over the draft vocabulary: the reduced one if the head has it, else the target's."""
        return self.draft_lm_head(h) if self.reduced else lm_head(h)

    def _full_ids(self, draft_ids: mx.array) -> mx.array:
        return self.vocab_map[draft_ids] if self.reduced else draft_ids

    def _full_probs(self, probs: mx.array) -> mx.array:
        if not self.reduced:
            return probs
        return mx.zeros((self.config.vocab_size,), probs.dtype).at[self.vocab_map].add(probs)


def init_draft_vocab(head: MTPHead, lm_weight: mx.array, token_ids: Sequence[int]) -> None:
    """Point a reduced head at `token_ids` of the target: their rows of its LM head [V, d]."""
    ids = mx.array(list(token_ids), dtype=mx.int32)
    if not head.reduced or ids.size != head.config.draft_vocab_size:
        raise ValueError(f"the head drafts over {head.config.draft_vocab_size} ids, got {ids.size}")
    head.vocab_map = ids
    head.draft_lm_head.weight = lm_weight[ids].astype(head.fc.weight.dtype)
    mx.eval(head.vocab_map, head.draft_lm_head.weight)


def shrink_draft_vocab(head: MTPHead, size: int) -> MTPHead:
    """The same head drafting over the first `size` ids of its map (kept most frequent first)."""
    if not head.reduced or not 0 < size <= head.config.draft_vocab_size:
        raise ValueError(f"cannot shrink a draft vocabulary of {head.config.draft_vocab_size} to {size}")
    smaller = MTPHead(replace(head.config, draft_vocab_size=size))
    weights = dict(tree_flatten(head.parameters()))
    weights["vocab_map"] = weights["vocab_map"][:size]
    weights["draft_lm_head.weight"] = weights["draft_lm_head.weight"][:size]
    smaller.load_weights(list(weights.items()))
    mx.eval(smaller.parameters())
    return smaller


def _rows(hidden: mx.array) -> mx.array:
    return hidden.reshape(1, -1, hidden.shape[-1])


def _token_rows(tokens: int | Sequence[int] | mx.array) -> mx.array:
    if isinstance(tokens, int):
        tokens = [tokens]
    array = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens))
    return array.astype(mx.int32).reshape(1, -1)


def save_mtp_head(head: MTPHead, directory: str | Path, dtype: mx.Dtype | None = None,
                  base: dict | None = None) -> Path:
    """Write `mtp_head.safetensors` and `mtp_head.json` into directory; returns the directory.

    dtype (e.g. mx.float16 for shipping) converts the floating tensors; ids stay integers.
    base: what the head fits (kernels/heads.py `base_record`), recorded beside its config."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: _as_dtype(value, dtype) for name, value in tree_flatten(head.parameters())}
    mx.save_safetensors(str(directory / HEAD_WEIGHTS), tensors)
    record = asdict(head.config) | ({"base": base} if base else {})
    (directory / HEAD_CONFIG).write_text(json.dumps(record, indent=2) + "\n")
    return directory


def shipped_head_dir(name: str = "smollm2-135m-instruct") -> Path:
    """The directory of a head shipped with metrale (the default model's by default)."""
    return SHIPPED_HEADS / name


def load_mtp_head(path: str | Path, dtype: mx.Dtype = mx.float32) -> MTPHead:
    """Load a head from a directory holding both files, or from its .safetensors path
    (the JSON then sits beside it with the same stem)."""
    path = Path(path)
    weights_path = path / HEAD_WEIGHTS if path.is_dir() else path
    config_path = path / HEAD_CONFIG if path.is_dir() else path.with_suffix(".json")
    fields = json.loads(config_path.read_text())
    fields.pop("base", None)  # what the head fits, read by kernels/heads.py
    fields["feature_layers"] = tuple(fields.get("feature_layers", ()))
    return _build_head(MTPConfig(**fields), mx.load(str(weights_path)), dtype)


def _build_head(config: MTPConfig, weights: Mapping[str, mx.array], dtype: mx.Dtype) -> MTPHead:
    head = MTPHead(config)
    # strict: a missing, extra or misshapen tensor is an error, not a silently random head.
    head.load_weights([(name, _as_dtype(value, dtype)) for name, value in weights.items()])
    mx.eval(head.parameters())
    head.eval()
    return head


def _as_dtype(value: mx.array, dtype: mx.Dtype | None) -> mx.array:
    floating = mx.issubdtype(value.dtype, mx.floating)
    return value.astype(dtype) if dtype is not None and floating else value
