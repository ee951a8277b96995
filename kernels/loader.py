"""Load a model for serving: an mlx-lm model directory, converted to float32 on CPU backends."""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction
from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model


class LoadedModel:
    def __init__(self, model: nn.Module, path: Path, config: dict, matmul: str = "stock",
                 layout: tuple[str, Fraction] | None = None):
        self.model, self.path, self.config = model, path, config
        # the decode steps' products ("rows kernel on for 4-12 rows", or "stock ..."), and ", compiled
        # layers" where kernels/compiled_blocks.py runs them
        self.matmul = matmul
        self.layout = layout  # distributed: ("tensor" | "pipeline", this rank's share of the KV); else None

    @property
    def context_length(self) -> int:
        return int(self.config.get("max_position_embeddings") or 4096)

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def quantization(self) -> dict | None:
        """bits, group_size and mode of a quantized model (mlx-lm's config entry); None if not."""
        q = self.config.get("quantization") or self.config.get("quantization_config")
        if not q:
            return None
        return {"bits": q.get("bits"), "group_size": q.get("group_size"), "mode": q.get("mode", "affine")}

    @property
    def dtype(self) -> str:
        """The weights' dtype ("float32"); quantized: "4-bit (group 64), float32 activations"."""
        floats = Counter(str(v.dtype).split(".")[-1] for _, v in tree_flatten(self.model.parameters())
                         if mx.issubdtype(v.dtype, mx.floating))
        # Packed quantized weights are integers; the floating rest (scales, norms) sets the activations.
        activations = floats.most_common(1)[0][0] if floats else "unknown"
        q = self.quantization
        if q is None:
            return activations
        mode = "" if q["mode"] == "affine" else f" {q['mode']}"
        return f"{q['bits']}-bit{mode} (group {q['group_size']}), {activations} activations"


def load(path: Path | str, rows_kernel: bool = True, channel=None, parallel: str = "auto",
         compiled: bool = True, fused_kernels: bool = True) -> LoadedModel:
    """The model, its few-row products on kernels/rows_matmul.py unless rows_kernel is False, its
    decoder layers' decode and verify work compiled (kernels/compiled_blocks.py) unless compiled is
    False (their attention and SwiGLU on kernels/rows_matmul/ unless fused_kernels is False). With a
    kernels.group Channel, this rank's part of it (kernels/sharding.py), split before its weights are
    read; every rank of the group calls this together (its layers run stock: a
    shard's products end in a collective sum)."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not an mlx-lm model directory (no config.json)")
    model, config = load_model(path, lazy=True)
    layout = None
    if channel is not None:
        from kernels.sharding import shard

        layout = shard(model, channel.group, parallel)
    if mx.default_device() == mx.cpu and not _is_quantized(config):
        # float32 is the fastest dtype for MLX's CPU ops (float16 ~3x slower here); the rows kernel
        # reads float16 copies where they are exact (kernels/rows_matmul.py).
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    config = config if isinstance(config, dict) else json.loads((path / "config.json").read_text())
    # The kernel goes in after the split: shard_linear takes only nn.Linear layers.
    matmul = use_rows_kernel(model, rows_kernel, channel)
    if compiled and channel is None:
        from kernels import compiled_blocks

        if compiled_blocks.install(model, fused_kernels):
            matmul += ", compiled layers" + (", fused kernels" if compiled_blocks.fused(model) else "")
    return LoadedModel(model, path, config, matmul=matmul, layout=layout)


def use_rows_kernel(model: nn.Module, wanted: bool, channel=None) -> str:
    """Swap the kernel in where wanted; says what the model's products run on. In a group every
    rank takes rank 0's row counts, and none takes the kernel unless all have it."""
    if not wanted:
        return "stock"
    from kernels import rows_matmul

    if channel is not None and not _agree_rows(model, channel):
        return "stock (rows kernel unavailable on some rank of the group)"
    swapped = rows_matmul.install(model) > 0 and rows_matmul.taken_rows()
    return f"rows kernel {rows_matmul.status()}" if swapped else f"stock (rows kernel {rows_matmul.status()})"


def _agree_rows(model: nn.Module, channel) -> bool:
    from kernels import rows_matmul

    mask = 0
    if channel.rank == 0 and rows_matmul.available():
        mask = sum(1 << r for r in rows_matmul.choose_for(model))  # timed on rank 0 alone
    facts = channel.gather_ints([int(rows_matmul.available()), mask])
    if not all(available for available, _ in facts):
        return False
    rows_matmul.adopt(r for r in range(64) if facts[0][1] >> r & 1)
    return True


def output_head(model):
    """The model's LM head as a callable; tied models use the embedding matrix transposed."""
    head = getattr(model, "lm_head", None)
    return head if head is not None else model.model.embed_tokens.as_linear


def _is_quantized(config: dict) -> bool:
    return "quantization" in config or "quantization_config" in config
