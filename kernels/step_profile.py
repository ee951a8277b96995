"""Where a step's time goes: a target forward of R rows split into op groups, each timed alone
over every layer with the model's own weights and shapes (metrale bench verify --breakdown).

Groups: the attention projections (q, k, v, o), the MLP products (gate, up, down), the LM head,
the attention core (scores, softmax, values over the cached context), the norms, RoPE and the
element-wise MLP and residual maths, and the acceptance maths (greedy argmax, to the host).
What the full forward costs beyond their sum is graph building, dispatch and the cache writes.
Needs a Llama-style block (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, two RMS norms).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from kernels import rows_matmul
from kernels.calibrate import VerifyProbe
from kernels.loader import output_head
from kernels.sampling import greedy_ids

GROUPS = ("attention projections", "mlp products", "lm head", "attention core", "norms, rope, element-wise",
          "acceptance maths")


def profile(model, rows: int, context: tuple[int, ...], repeats: int) -> dict[str, float]:
    """Median ms of each group and of the whole verify step at `rows` rows (width 1)."""
    layers = model.model.layers
    hidden = mx.random.normal((1, rows, model.args.hidden_size))
    mlp_in = mx.random.normal((1, rows, layers[0].mlp.gate_proj.weight.shape[0]))
    probe = VerifyProbe(model, 1, context, rows - 1)
    attn = layers[0].self_attn
    heads, kv_heads = attn.n_heads, attn.n_kv_heads
    head_dim = model.args.hidden_size // heads
    q = mx.random.normal((1, heads, rows, head_dim))
    keys = mx.random.normal((1, kv_heads, len(context) + rows, head_dim))
    logits = mx.random.normal((rows, model.args.vocab_size))
    mx.eval(hidden, mlp_in, q, keys, logits)
    parts: dict[str, Callable[[], object]] = {
        "attention projections": lambda: [getattr(l.self_attn, p)(hidden) for l in layers
                                          for p in ("q_proj", "k_proj", "v_proj", "o_proj")],
        "mlp products": lambda: [y for l in layers for y in (l.mlp.gate_proj(hidden), l.mlp.up_proj(hidden),
                                                             l.mlp.down_proj(mlp_in))],
        "lm head": lambda: output_head(model)(hidden),
        "attention core": lambda: [_attention_core(q, keys, rows, head_dim) for _ in layers],
        "norms, rope, element-wise": lambda: [_elementwise(l, hidden, mlp_in, q) for l in layers],
    }
    found = {name: _median_ms(lambda f=f: mx.eval(f()), repeats) for name, f in parts.items()}
    found["acceptance maths"] = _median_ms(lambda: _acceptance(logits), repeats)
    found["full verify step"] = _median_ms(lambda: probe(rows - 1), repeats)
    return found


def step_bytes(model, context: int) -> int:
    """Bytes one decode step must read: every weight it multiplies by, as the rows kernel reads it (a
    float16 copy where one stands for the weight exactly), and the cached keys and values."""
    halves = rows_matmul.reads_halves(model)
    weights = sum(_read_bytes(v, halves) for _, v in tree_flatten(model.parameters()))
    if getattr(model, "lm_head", None) is not None:  # untied: of the embedding only one row is read
        weights -= _read_bytes(model.model.embed_tokens.weight, halves)
    args = model.args
    kv = getattr(args, "num_key_value_heads", args.num_attention_heads)
    head_dim = args.hidden_size // args.num_attention_heads
    return weights + 2 * args.num_hidden_layers * kv * head_dim * context * 4


def _read_bytes(weight: mx.array, halves: bool) -> int:
    return weight.nbytes // 2 if halves and rows_matmul.halved(weight) is not None else weight.nbytes


def supported(model) -> bool:
    layer = model.model.layers[0]
    return all(hasattr(layer.self_attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "rope")) and \
        all(hasattr(layer.mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))


def _attention_core(q: mx.array, keys: mx.array, rows: int, head_dim: int) -> mx.array:
    mask = "causal" if rows > 1 else None
    return mx.fast.scaled_dot_product_attention(q, keys, keys, scale=head_dim ** -0.5, mask=mask)


def _elementwise(layer, hidden: mx.array, mlp_in: mx.array, q: mx.array) -> list[mx.array]:
    attn = layer.self_attn
    normed = layer.input_layernorm(hidden) + layer.post_attention_layernorm(hidden)
    return [attn.rope(q, offset=128), hidden + normed, nn.silu(mlp_in) * mlp_in]


def _acceptance(logits: mx.array) -> list[int]:
    return greedy_ids(logits).tolist()  # as Engine.verify


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)
