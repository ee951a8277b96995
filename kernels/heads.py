"""Finding and loading the drafter a model is served with: its MTP head or a draft model.

A head is found by what it fits, not by the model folder's name: its json records its base model
(`base`: architecture, sizes, a hash of the vocabulary), so a renamed or quantized copy of the base
gets the head, and a head is refused, with the reason logged, for a model that differs in any of them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)
import structlog

from kernels.mtp_head import HEAD_CONFIG, HEAD_WEIGHTS

SHIPPED = Path(__file__).resolve().parent / "heads"
BASE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")


def base_record(model_dir: Path) -> dict:
    """What a head trained on this model records about it, and what a head must match to be used."""
    return {**model_facts(model_dir), "tokenizer_sha256": tokenizer_hash(model_dir)}


def model_facts(model_dir: Path) -> dict:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config", config)  # multimodal configs nest the language model's
    return {"model_type": config.get("model_type"), **{k: text.get(k) for k in BASE_KEYS[1:]}}


def tokenizer_hash(model_dir: Path) -> str | None:
    """sha256 of the vocabulary (token -> id, added tokens too): it survives a re-saved tokenizer.json."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    return hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()


def misfit(head_dir: Path, model_dir: Path, need_base: bool = True) -> str | None:
    """Why the head in head_dir cannot draft for the model in model_dir; None when it fits.
    need_base: a head that records no base is refused (only shipped heads need one)."""
    record = json.loads((head_dir / HEAD_CONFIG).read_text())
    model = model_facts(model_dir)
    base = record.get("base") or {}
    if not base and need_base:
        return "the head records no base model"
    # The head's own shape binds it to the base's hidden size and vocabulary, recorded or not.
    expected = {"hidden_size": record["hidden_size"], "vocab_size": record.get("vocab_size")} | base
    for key in BASE_KEYS:
        if expected.get(key) is not None and expected[key] != model[key]:
            return f"{key} is {model[key]}; the head is for {expected[key]}"
    if base.get("tokenizer_sha256") and base["tokenizer_sha256"] != tokenizer_hash(model_dir):
        return "the model's vocabulary (tokenizer.json) differs from the head's base"
    return None


def find_mtp_head(model_dir: Path, explicit: str | None = None) -> Path | None:
    """An explicit folder (it must fit), else one beside the model, else a shipped head that fits."""
    model_dir = Path(model_dir)
    if explicit:
        path = Path(explicit).expanduser()
        if not (path / HEAD_WEIGHTS).exists():
            raise FileNotFoundError(f"--mtp-head {path}: no {HEAD_WEIGHTS} there")
        if reason := misfit(path, model_dir, need_base=False):
            raise ValueError(f"--mtp-head {path} does not fit {model_dir.name}: {reason}")
        return path
    beside = (model_dir / HEAD_WEIGHTS).exists() and (model_dir / HEAD_CONFIG).exists()
    candidates = [(model_dir, False)] if beside else []
    candidates += [(f, True) for f in sorted(SHIPPED.glob("*")) if (f / HEAD_WEIGHTS).exists()]
    for folder, need_base in candidates:
        if (reason := misfit(folder, model_dir, need_base)) is None:
            return folder
        structlog.get_logger().info("mtp_head_refused", actor="heads", head=str(folder), model=model_dir.name,
                                    reason=reason)
    return None


def build_drafter(kind: str, target, model_dir: Path, draft_model: str | None, mtp_head: str | None,
                  rows_kernel: bool = True, compiled: bool = True, fused_kernels: bool = True):
    """(resolved kind, engine-side drafter or None). n-gram and none need nothing on the owner.
    compiled: an MTP head's block runs as compiled graphs, as the target's layers do (--compiled-layers)."""
    from kernels.loader import use_rows_kernel

    path = find_mtp_head(model_dir, mtp_head) if kind in ("auto", "mtp") else None
    chosen = kind
    if kind == "auto":
        kind = "mtp" if path is not None else "ngram"
    if kind == "mtp":
        from kernels.drafters import MtpDrafter
        from kernels.features import layers_misfit
        from kernels.mtp_head import load_mtp_head

        if path is None:
            raise FileNotFoundError(f"--drafter mtp: no MTP head fits {model_dir} (give --mtp-head PATH)")
        head = load_mtp_head(path)
        if chosen == "auto" and (reason := layers_misfit(target, head.config.feature_layers)):
            # e.g. one rank of a split model: the head's layers are not all here; --drafter mtp says so
            structlog.get_logger().warning("mtp_head_refused", actor="heads", head=str(path), reason=reason)
            return "ngram", None
        use_rows_kernel(head, rows_kernel)  # K head forwards of one row per draft
        if compiled:
            from kernels import compiled_blocks

            compiled_blocks.install_head(head, fused_kernels)
        return kind, MtpDrafter(head, target)
    if kind == "draft-model":
        from kernels.drafters import DraftModelDrafter
        from kernels.loader import load

        return kind, DraftModelDrafter(load(draft_model, rows_kernel).model)
    return kind, None
