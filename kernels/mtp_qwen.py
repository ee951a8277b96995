"""The MTP head of a Qwen3.5 (or dense Qwen3-Next-style) checkpoint: its `mtp.*` tensors, which
mlx-lm drops when it loads the model, as a kernels.mtp_head.MTPHead."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx

from kernels.mtp_head import MTPConfig, MTPHead, _build_head

_DENSE_MLP = tuple(f"mlp.{name}.weight" for name in ("gate_proj", "up_proj", "down_proj"))


def qwen_mtp_config(hf_config: Mapping) -> MTPConfig:
    """The MTPConfig of a Qwen3.5 / Qwen3-Next config.json (top level or its text_config)."""
    text = hf_config.get("text_config", hf_config)
    rope = text.get("rope_parameters") or {}
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    partial = text.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    return MTPConfig(
        hidden_size=text["hidden_size"],
        num_attention_heads=heads,
        num_key_value_heads=text.get("num_key_value_heads", heads),
        intermediate_size=text["intermediate_size"],
        rms_norm_eps=text.get("rms_norm_eps", 1e-6),
        rope_theta=text.get("rope_theta", rope.get("rope_theta", 10000.0)),
        head_dim=head_dim,
        rope_dims=int(head_dim * partial),
        qk_norm=True,
        gated_attention=True,
        own_norm=True,
        num_layers=text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 1)),
    )


def map_qwen_mtp_weights(checkpoint: Mapping[str, mx.array]) -> dict[str, mx.array]:
    """`mtp.*` checkpoint tensors -> MTPHead parameter names (other tensors are ignored)."""
    mapped = {}
    for name, value in checkpoint.items():
        if not name.startswith("mtp."):
            continue
        local = name[len("mtp.") :]
        if ".mlp." in local and not local.endswith(_DENSE_MLP):
            raise ValueError(f"mixture-of-experts MTP layers are not supported ({name})")
        if local.endswith("norm.weight") and value.ndim == 1:
            value = value + 1.0  # Qwen stores zero-centred RMSNorm weights: scale is 1 + w
        mapped[local] = value
    if not mapped:
        raise ValueError("the checkpoint has no 'mtp.' tensors")
    return mapped


def load_qwen_mtp_head(model_dir: str | Path, dtype: mx.Dtype = mx.float32) -> MTPHead:
    """The MTP head of a raw Hugging Face Qwen3.5 checkpoint directory."""
    model_dir = Path(model_dir)
    config = qwen_mtp_config(json.loads((model_dir / "config.json").read_text()))
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted({file for name, file in weight_map.items() if name.startswith("mtp.")})
    else:
        shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    checkpoint = {}
    for shard in shards:
        checkpoint.update(mx.load(str(model_dir / shard)))
    return _build_head(config, map_qwen_mtp_weights(checkpoint), dtype)
