"""Tiny random models for unit tests: seeded, 2 layers, hidden 64, vocab 128; built in milliseconds."""

from __future__ import annotations

import kernels  # noqa: F401
import mlx.core as mx
from mlx_lm.models import llama

TINY_ARGS = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=128,
    rope_theta=10000.0, tie_word_embeddings=False,
)


def tiny_llama(seed: int = 0, **overrides) -> llama.Model:
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict({**TINY_ARGS, **overrides}))
    # Random init gives near-flat logits, and tied heads repeat the last token; an untied head
    # scaled up gives peaked but varied distributions, like a trained model's.
    if not model.args.tie_word_embeddings:
        model.lm_head.weight = model.lm_head.weight * 4
    mx.eval(model.parameters())
    return model


def save_tiny_dir(folder, seed: int = 0, vocab_order: int = 1, **overrides):
    """tiny_llama(seed, **overrides) as an mlx-lm model directory: config.json, model.safetensors
    and a word-level tokenizer.json (token i is "t<i>"; vocab_order=-1 numbers the words backwards,
    a tokenizer of the same size with another vocabulary)."""
    import json
    from pathlib import Path

    from mlx.utils import tree_flatten
    from tokenizers import Tokenizer, models

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    args = {**TINY_ARGS, **overrides}
    model = tiny_llama(seed, **overrides)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps({**args, "max_position_embeddings": 512}))
    size = args["vocab_size"]
    words = {f"t{i if vocab_order > 0 else size - 1 - i}": i for i in range(size)}
    Tokenizer(models.WordLevel(words, unk_token="t1")).save(str(folder / "tokenizer.json"))
    return folder
