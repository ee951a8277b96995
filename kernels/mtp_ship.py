"""Ship a trained MTP head: cut its draft vocabulary, store it in float16 beside its training record.

    metrale train-mtp ship --head ~/.cache/metrale/mtp/run4/head --draft-vocab 4096 \
        --out kernels/heads/smollm2-135m-instruct
writes mtp_head.safetensors and mtp_head.json, and train.json: the run's own record (sitting beside
its head folder) with a `shipped` entry naming this command. The model card is written by hand.
mtp_head.json records the base model the head fits (`base`: architecture, sizes, vocabulary hash),
which is how `metrale serve` finds it for that model under any folder name or quantization;
`--model` names the base, by default the model the run's training data was made with.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx

from kernels.heads import base_record
from kernels.mtp_data import command_line
from kernels.mtp_head import load_mtp_head, save_mtp_head, shipped_head_dir, shrink_draft_vocab


def ship(head_dir: Path, out: Path, draft_vocab: int, command: str, model: Path | None = None) -> Path:
    head = load_mtp_head(head_dir)
    if draft_vocab and draft_vocab != head.config.draft_vocab_size:
        head = shrink_draft_vocab(head, draft_vocab)
    record_path = head_dir.parent / "train.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"head": str(head_dir)}
    model = model or base_model_of(record)
    save_mtp_head(head, out, dtype=mx.float16, base=base_record(model))
    record["shipped"] = {"draft_vocab": head.config.draft_vocab_size, "dtype": "float16", "command": command,
                         "base_model": str(model)}
    (out / "train.json").write_text(json.dumps(record, indent=2) + "\n")
    return out


def base_model_of(record: dict) -> Path:
    """The model the run's training data was answered by (every data folder names it)."""
    models = {r.get("args", {}).get("model") for r in record.get("data_recipes", ())} - {None}
    if len(models) != 1:
        raise SystemExit(f"cannot tell the head's base model from its train.json ({sorted(models)}): give --model DIR")
    return Path(models.pop())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="a trained head folder (train.json beside it)")
    parser.add_argument("--draft-vocab", type=int, default=4096, help="keep the N most frequent (0: all)")
    parser.add_argument("--out", default=str(shipped_head_dir()))
    parser.add_argument("--model", help="the base model directory (default: the one the data was made with)")
    args = parser.parse_args(argv)
    model = Path(args.model).expanduser() if args.model else None
    out = ship(Path(args.head).expanduser(), Path(args.out).expanduser(), args.draft_vocab,
               command_line("kernels.mtp_ship"), model)
    size = (out / "mtp_head.safetensors").stat().st_size / 1e6
    print(f"shipped {args.head} to {out} ({size:.1f} MB)")


if __name__ == "__main__":
    main()
