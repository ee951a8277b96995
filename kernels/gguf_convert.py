"""Convert a llama-architecture GGUF file into an mlx-lm model directory (float32 weights)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx

# GGUF tensor names -> mlx-lm llama names (per block, then global).
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_GROUP_SIZE = 32  # every GGUF block type MLX reads (Q4_0, Q4_1, Q8_0) packs 32 values


def llama_config(meta: dict) -> dict:
    """The mlx-lm config.json of a llama GGUF, from its metadata."""
    arch = str(meta["general.architecture"])
    if arch != "llama":
        raise ValueError(f"only llama-architecture GGUF files are supported, not {arch!r}")

    def get(key: str):
        return meta[f"llama.{key}"].item()

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv"),
        "head_dim": hidden // heads,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base"),
        "max_position_embeddings": get("context_length"),
        "vocab_size": get("vocab_size"),
        "tie_word_embeddings": True,  # corrected below when an output tensor exists
    }


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's interleaving of the rotary halves in q/k projection rows."""
    rows = w.shape[0]
    w = w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
    return w.swapaxes(1, 2).reshape(rows, *w.shape[3:])


def hf_name(gguf_name: str) -> str:
    base, _, leaf = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{leaf}"
    return f"{_GLOBAL_NAMES[base]}.{leaf}"


def dequantized_weights(raw: dict[str, mx.array], config: dict) -> dict[str, mx.array]:
    """float32 weights under mlx-lm names, with q/k rows restored to the HF order."""
    out = {}
    for name, value in raw.items():
        if name.endswith((".scales", ".biases")):
            continue
        prefix = name.rsplit(".", 1)[0]
        if f"{prefix}.scales" in raw:
            bits = 32 * value.shape[-1] // (raw[f"{prefix}.scales"].shape[-1] * _GROUP_SIZE)
            value = mx.dequantize(
                value, raw[f"{prefix}.scales"], raw[f"{prefix}.biases"],
                group_size=_GROUP_SIZE, bits=bits,
            )
        value = value.astype(mx.float32)
        if prefix.endswith("attn_q"):
            value = unpermute_rows(value, config["num_attention_heads"])
        elif prefix.endswith("attn_k"):
            value = unpermute_rows(value, config["num_key_value_heads"])
        out[hf_name(name)] = value
    return out


def _plain(value):
    """Metadata values as plain Python (mx.load gives arrays for numbers)."""
    if isinstance(value, mx.array):
        return value.tolist()
    return value


def write_tokenizer(meta: dict, out_dir: Path) -> None:
    """tokenizer.json and tokenizer_config.json from the GGUF's own vocabulary and template."""
    # transformers' GGUF reader imports torch, so the grouping it does is done here from mx.load's metadata.
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    grouped = {
        group: {name: _plain(meta[f"tokenizer.{key}"]) for key, name in renames.items() if f"tokenizer.{key}" in meta}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tok_dict, tok_config = grouped["tokenizer"], grouped["tokenizer_config"]
    backend, _ = convert_gguf_tokenizer(str(meta["general.architecture"]), tok_dict)
    backend.save(str(out_dir / "tokenizer.json"))
    tokens = tok_dict["tokens"]
    for name in ("bos", "eos", "unk", "pad"):
        token_id = tok_dict.get(f"{name}_token_id")
        if token_id is not None:
            tok_config[f"{name}_token"] = tokens[token_id]
    tok_config.setdefault("add_bos_token", False)
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))


def convert_gguf(gguf_path: Path, out_dir: Path, progress=None) -> Path:
    """Write config.json, model.safetensors and the tokenizer into out_dir (made atomically)."""
    raw, meta = mx.load(str(gguf_path), return_metadata=True)
    config = llama_config(meta)
    weights = dequantized_weights(raw, config)
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    tmp = out_dir.with_name(out_dir.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    if progress:
        progress("weights")
    mx.save_safetensors(str(tmp / "model.safetensors"), weights)
    if progress:
        progress("tokenizer")
    write_tokenizer(meta, tmp)
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    tmp.rename(out_dir)
    return out_dir
