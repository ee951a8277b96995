"""One model over a group of processes, with MLX's own primitives: tensor parallel is mlx-lm's
`model.shard(group)`; pipeline is mlx-lm's `model.model.pipeline(group)` where the architecture has
it, and for llama (which has none in mlx-lm) the same scheme here, on mx.distributed send / recv /
all_gather.

Pipeline follows mlx-lm's convention: rank 0 holds the last layers, rank size-1 the first; each
stage receives the hidden state from the rank above it and sends its output to the rank below, and
rank 0's final hidden state reaches every rank through one all_gather, so every rank computes the
same logits. A rank keeps only its own layers (and their KV caches). The ranks' graphs differ (a
receive here, a send there), so the engine evaluates each forward before it builds the next: two
forwards in one evaluation could pair one's send with the other's receive.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask

from runtime.config import ConfigError

Parallel = Literal["auto", "tensor", "pipeline"]


class ShardingError(ConfigError):
    """A model that cannot be split this way over this group; the message says why."""


def shard(model, group, parallel: Parallel) -> tuple[str, Fraction]:
    """Split `model` over `group` in place, before its weights are evaluated (each rank then reads
    only its part). Returns the layout ("tensor" or "pipeline") and the share of the model's KV this
    rank holds (the prompt cache counts entries in whole-model bytes, the same on every rank)."""
    size = group.size()
    if parallel == "auto":
        parallel = "tensor" if tensor_problem(model, size) is None else "pipeline"
    if parallel == "tensor":
        if (why := tensor_problem(model, size)) is not None:
            raise ShardingError(f"--parallel tensor: {why}; --parallel pipeline splits by layers instead")
        model.shard(group)
        return "tensor", Fraction(1, size)
    total = len(model.layers)
    if total < size:
        raise ShardingError(f"--parallel pipeline: {total} layers cannot be split over {size} processes")
    if isinstance(model.model, llama.LlamaModel):
        _pipeline_llama(model.model, group)
    elif hasattr(model.model, "pipeline"):
        _pipeline_mlx_lm(model.model, group)
    else:
        raise ShardingError(f"--parallel pipeline: the {type(model).__module__} architecture has no pipeline "
                            f"split (mlx-lm's model.model.pipeline) and is not llama")
    return "pipeline", Fraction(len(model.layers), total)


def tensor_problem(model, size: int) -> str | None:
    """Why `model.shard` cannot split this model over `size` ranks, or None."""
    if not hasattr(model, "shard"):
        return f"the {type(model).__module__} architecture has no tensor-parallel split (model.shard)"
    args = getattr(model, "args", None)
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(args, name, None)
        if isinstance(value, int) and value % size:  # mlx-lm's shard divides heads with //, silently
            return f"{name} = {value} is not divisible by the group size {size}"
    return None


def split(layers: int, size: int, rank: int) -> tuple[int, int]:
    """Rank's layers [start, end): an even split, the low ranks taking the extra ones, rank 0 last
    (mlx-lm's PipelineMixin order)."""
    base, extra = divmod(layers, size)
    counts = [base + (1 if r < extra else 0) for r in range(size)]
    start = sum(counts[rank + 1:])
    return start, start + counts[rank]


def _pipeline_mlx_lm(inner, group) -> None:
    """mlx-lm's own split, then only this rank's layers kept, so caches are made for them alone."""
    inner.pipeline(group)
    inner.layers = inner.pipeline_layers
    inner.start_idx, inner.end_idx = 0, None


def _pipeline_llama(inner: llama.LlamaModel, group) -> None:
    if inner.sliding_window is not None and any(layer.use_sliding for layer in inner.layers):
        raise ShardingError("--parallel pipeline: llama models with sliding-window layers are not split here")
    start, end = split(len(inner.layers), group.size(), group.rank())
    inner.layers = inner.layers[start:end]
    inner.pipeline_group = group
    # The instance keeps its parameters (their names too); only its forward changes.
    inner.__class__ = PipelinedLlama


class PipelinedLlama(llama.LlamaModel):
    """A llama model's stage: this rank's layers between a receive and a send (see the docstring)."""

    def __call__(self, inputs: mx.array, cache=None, input_embeddings: mx.array | None = None):
        group = self.pipeline_group
        rank, size = group.rank(), group.size()
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        if cache is None:
            cache = [None] * len(self.layers)
        mask = create_attention_mask(h, cache[0])
        if rank < size - 1:
            h = mx.distributed.recv(h.shape, h.dtype, rank + 1, group=group)
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, cache=c)
        if rank > 0:
            h = mx.distributed.send(h, rank - 1, group=group)
            if cache[-1] is not None:  # the send must run when the step is evaluated
                cache[-1].keys = mx.depends(cache[-1].keys, h)
        h = mx.distributed.all_gather(h, group=group)[: h.shape[0]]
        return self.norm(h)


def started(loaded, drafter, channel) -> tuple[str, dict[str, float]]:
    """After every rank has loaded its part: (the layout, the collectives' costs alone). A fused MTP
    head reads several layers' outputs, which a pipeline splits over the ranks: refused, on every rank."""
    layout = loaded.layout[0]
    if layout == "pipeline" and getattr(drafter, "feature_layers", ()):
        raise ShardingError(f"--parallel pipeline: the MTP head reads layers {list(drafter.feature_layers)}, "
                            f"which live on several ranks; use --parallel tensor or a last-layer head")
    return layout, probe_collectives(loaded.model, layout, channel)


def probe_collectives(model, layout: str, channel) -> dict[str, float]:
    """ms, every rank together and nothing else running: one forward's collectives alone, by rows
    (1: decode, 4: a verify), and one command's broadcast ("command")."""
    times = {str(rows): _collectives_ms(model, layout, channel.group, rows) for rows in (1, 4)}
    times["command"] = fastest_ms(channel.idle_broadcast, 20)
    return {k: round(v, 4) for k, v in times.items()}


def _collectives_ms(model, layout: str, group, rows: int, repeats: int = 20) -> float:
    """Run by every rank together: the communication a step pays, apart from its compute (tensor:
    two all_sums per layer; pipeline: a receive and a send per stage, then the all_gather)."""
    hidden = model.args.hidden_size
    x = mx.zeros((1, rows, hidden), dtype=mx.float32)
    mx.eval(x)
    rank, size = group.rank(), group.size()

    def forward(h):
        if layout == "tensor":
            for _ in range(2 * len(model.layers)):
                h = mx.distributed.all_sum(h, group=group)
            return h
        if rank < size - 1:
            h = mx.distributed.recv(h.shape, h.dtype, rank + 1, group=group)
        if rank > 0:
            h = mx.distributed.send(h, rank - 1, group=group)
        return mx.distributed.all_gather(h, group=group)[:1]

    return fastest_ms(lambda: mx.eval(forward(x)), repeats)


def fastest_ms(fn, repeats: int) -> float:
    """The fastest of `repeats` calls (ms), after one untimed call (the first exchange sets up
    buffers): the collectives' own cost, without what another process on a shared core adds."""
    import time

    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - started))
    return min(times)
