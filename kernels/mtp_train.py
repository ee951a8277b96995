"""Train an MTP head on self-distillation data (kernels/mtp_data.py); the base model stays frozen.

Each window of a sequence gives, at position j, the pair (h_j, tokens[j+1]) and the target
g_{j+1}, the base's own greedy token after tokens[j+1]. The objective (unrolled depths as they run
when drafting, their weights, the regression onto h_{j+1}) is kernels/mtp_loss.py.
`--feature-layers` trains a fused head (EAGLE-3 style, kernels/features.py) on data that kept
those layers; it starts as a pass-through of h_j, so from `--init-from` a last-layer head it starts
as that head.

Checkpoints (head, optimizer state, step) are written atomically every few steps; rerunning the
same command resumes from the last one. The finished head, its training record (train.json:
command, data recipe, hyperparameters, validation accuracy) and the data recipe go to --out.
  OPENBLAS_NUM_THREADS=1 python -m kernels.mtp_train --data ~/.cache/metrale/mtp/data \
      --out ~/.cache/metrale/mtp/run
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from kernels.mtp_batches import (
    Batches, coverage, draft_index, frequent_tokens, sequences_from, split_sequences,
)
from kernels.mtp_data import DEFAULT_MODEL, command_line, load_shards
from kernels.mtp_head import MTPConfig, MTPHead, init_draft_vocab, load_mtp_head, save_mtp_head
from kernels.mtp_loss import WEIGHTINGS, unrolled_loss, validate


def head_config(base_args, draft_vocab: int, feature_layers: tuple[int, ...] = ()) -> MTPConfig:
    return MTPConfig(
        hidden_size=base_args.hidden_size,
        num_attention_heads=base_args.num_attention_heads,
        num_key_value_heads=base_args.num_key_value_heads,
        intermediate_size=base_args.intermediate_size,
        rms_norm_eps=base_args.rms_norm_eps,
        rope_theta=base_args.rope_theta,
        head_dim=getattr(base_args, "head_dim", None),
        draft_vocab_size=draft_vocab,
        vocab_size=base_args.vocab_size,
        feature_layers=tuple(feature_layers),
    )


def lm_weight(base) -> mx.array:
    return base.lm_head.weight if "lm_head" in base else base.model.embed_tokens.weight


def new_head(base, draft_ids: list[int], init: str, seed: int, init_from: str | None = None,
             feature_layers: tuple[int, ...] = ()) -> MTPHead:
    mx.random.seed(seed)
    head = MTPHead(head_config(base.args, len(draft_ids), feature_layers))
    if "features" in head:
        head.features.pass_through()  # a fused head starts reading h_j alone; an earlier fused head overrides
    if init_from:
        # Continue from a trained head: its block, fc and norms; the draft vocabulary is new.
        earlier = tree_flatten(load_mtp_head(Path(init_from).expanduser()).parameters())
        kept = [(n, v) for n, v in earlier if not n.startswith(("draft_lm_head", "vocab_map"))]
        if "features" not in head:
            kept = [(n, v) for n, v in kept if not n.startswith("features.")]
        head.load_weights(kept, strict=False)
    elif init == "last-layer":
        # The base's last block already turns a stream into next-token features: a warm start.
        head.layers[0].update(base.model.layers[-1].parameters())
    elif init == "identity":
        # Start as "the head's output is h_t itself": fc passes the normed hidden half through
        # and the block's residual branches start at zero, so logits start at the base's scale.
        dim = head.config.hidden_size
        head.fc.weight = mx.concatenate([mx.zeros((dim, dim)), mx.eye(dim)], axis=1)
        block = head.layers[0]
        block.self_attn.o_proj.weight = mx.zeros_like(block.self_attn.o_proj.weight)
        block.mlp.down_proj.weight = mx.zeros_like(block.mlp.down_proj.weight)
    init_draft_vocab(head, lm_weight(base), draft_ids)
    return head


def trainable(head: MTPHead, train_lm_head: bool) -> MTPHead:
    head.unfreeze()
    head.freeze(recurse=False, keys=["vocab_map"])
    if not train_lm_head:
        head.draft_lm_head.freeze()  # stays the base's own rows: drafts score like the target
    return head


def save_checkpoint(directory: Path, head: MTPHead, optimizer, step: int) -> None:
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_mtp_head(head, tmp)
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
    (tmp / "step.json").write_text(json.dumps({"step": step}))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)  # a checkpoint is either whole or the previous one


def load_checkpoint(directory: Path, optimizer) -> tuple[MTPHead, int]:
    head = load_mtp_head(directory)
    optimizer.state = tree_unflatten(list(mx.load(str(directory / "optimizer.safetensors")).items()))
    return head, json.loads((directory / "step.json").read_text())["step"]


def schedule(lr: float, steps: int, warmup: int):
    warm = optim.linear_schedule(lr * 0.01, lr, max(1, warmup))
    decay = optim.cosine_decay(lr, max(1, steps - warmup), lr * 0.05)
    return optim.join_schedules([warm, decay], [warmup])


def train(base, train_batches: Batches, val_batches: list[dict], head: MTPHead, args, log) -> MTPHead:
    ckpt = Path(args.out).expanduser() / "checkpoint"
    optimizer = optim.AdamW(schedule(args.lr, args.steps, args.warmup), weight_decay=args.weight_decay)
    step = 0
    if (ckpt / "step.json").exists():
        head, step = load_checkpoint(ckpt, optimizer)
        log({"event": "resumed", "step": step})
    trainable(head, args.train_lm_head)
    loss_and_grad = nn.value_and_grad(
        head, lambda b: unrolled_loss(head, base, b, args.depths, args.feature_weight, args.soft_weight,
                                      args.weighting))
    started = time.perf_counter()
    last = min(args.steps, args.stop_after or args.steps)  # a run may stop early, to resume later
    while step < last:
        (loss, correct, counted), grads = loss_and_grad(train_batches.at(step))
        grads, _ = optim.clip_grad_norm(grads, args.clip)
        optimizer.update(head, grads)
        mx.eval(head.parameters(), optimizer.state, loss)
        step += 1
        if step % args.log_every == 0:
            log({"step": step, "loss": round(loss.item(), 4),
                 "acc": [round(x, 3) for x in (correct / mx.maximum(counted, 1)).tolist()],
                 "lr": round(optimizer.learning_rate.item(), 6),
                 "s_per_step": round((time.perf_counter() - started) / args.log_every, 2)})
            started = time.perf_counter()
        if step % args.checkpoint_every == 0 or step == last:
            save_checkpoint(ckpt, head, optimizer, step)
        if step % args.eval_every == 0 and step < args.steps:  # the last step's is run()'s final one
            scores = validate(head, base, val_batches, args.depths)
            log({"step": step, "val_acc": scores["top1_by_depth"], "val_expected_length": scores["expected_length"]})
    return head


def run(args: argparse.Namespace, base=None) -> Path:
    """Train (or resume) and write the head; base: the loaded model, else loaded from --model."""
    from kernels.loader import load

    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    logfile = (out / "train.log").open("a")

    def log(record: dict) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        logfile.write(line + "\n")
        logfile.flush()

    base = base if base is not None else load(args.model, rows_kernel=False, compiled=False).model  # training: no vjp
    base.freeze()
    if args.keep_draft_vocab and not args.init_from:
        raise SystemExit("--keep-draft-vocab needs --init-from HEAD")
    layers = tuple(args.feature_layers)
    seqs = [s for d in args.data for s in sequences_from(load_shards(Path(d).expanduser()), stored_layers(d), layers)]
    train_seqs, val_seqs = split_sequences(seqs)
    vocab = base.args.vocab_size
    if args.keep_draft_vocab:  # the earlier head's own draft tokens: heads compared on one vocabulary
        draft_ids = load_mtp_head(Path(args.init_from).expanduser()).vocab_map.tolist()
    else:
        draft_ids = frequent_tokens(train_seqs, args.draft_vocab, vocab)
    index = draft_index(draft_ids, vocab)
    answers_only = args.loss_on == "answers"
    batches = Batches(train_seqs, index, args.window, args.batch, args.seed, answers_only)
    val = Batches(val_seqs, index, args.window, args.batch, args.seed, answers_only).all()
    log({"event": "data", "train_seqs": len(train_seqs), "val_seqs": len(val_seqs),
         "train_windows": len(batches.windows), "steps_per_epoch": batches.steps_per_epoch,
         "train_tokens": sum(len(s.tokens) for s in train_seqs),
         "val_coverage": round(coverage(val_seqs, draft_ids), 4)})
    head = new_head(base, draft_ids, args.init, args.seed, args.init_from, layers)
    head = train(base, batches, val, head, args, log)
    final = validate(head, base, val, args.depths)
    log({"step": args.steps, "val_acc": final["top1_by_depth"], "val_expected_length": final["expected_length"]})
    save_mtp_head(head, out / "head", dtype=mx.float16)
    _write_record(out, args, final, coverage(val_seqs, draft_ids), len(train_seqs))
    return out / "head"


def stored_layers(data: str) -> tuple[int, ...]:
    """The decoder layers whose outputs a data folder kept (its recipe.json; none before fused heads)."""
    recipe = Path(data).expanduser() / "recipe.json"
    return tuple(json.loads(recipe.read_text()).get("feature_layers", ())) if recipe.exists() else ()


def _write_record(out: Path, args, scores: dict, val_coverage: float, seqs: int) -> None:
    recipes = []
    for data in (Path(d).expanduser() for d in args.data):
        recipes.append(json.loads((data / "recipe.json").read_text()) if (data / "recipe.json").exists() else {})
    record = {
        "command": command_line("kernels.mtp_train"),
        "hyperparameters": {k: v for k, v in vars(args).items() if k not in ("data", "out", "model")},
        "data_recipes": recipes,
        "train_sequences": seqs,
        "validation": {**scores, "draft_vocab_coverage": val_coverage},
    }
    if args.init_from:  # the run this one continued: its record beside its head folder (a shipped head: inside)
        head_dir = Path(args.init_from).expanduser()
        found = [p for p in (head_dir.parent / "train.json", head_dir / "train.json") if p.exists()]
        record["continued_from"] = json.loads(found[0].read_text()) if found else str(args.init_from)
    (out / "train.json").write_text(json.dumps(record, indent=2) + "\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train an MTP head by self-distillation (frozen base).")
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--data", nargs="+", default=["~/.cache/metrale/mtp/data"])
    p.add_argument("--out", default="~/.cache/metrale/mtp/run")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--depths", type=int, default=2, help="draft depths unrolled in training")
    p.add_argument("--weighting", choices=WEIGHTINGS, default="harmonic",
                   help="depth weights: 1/(p+1), or each chain's gain in expected accepted length")
    p.add_argument("--feature-layers", type=int, nargs="*", default=[], metavar="N",
                   help="a fused head: these decoder layers' outputs with the last hidden state (the data must hold them)")
    p.add_argument("--loss-on", choices=["answers", "all"], default="answers",
                   help="train (and validate) on answer positions only, or on prompts too")
    p.add_argument("--soft-weight", type=float, default=0.0,
                   help="weight of cross-entropy against the base's next distribution (draft vocabulary)")
    p.add_argument("--feature-weight", type=float, default=1.0, help="weight of h regression")
    p.add_argument("--init-from", default=None, help="a trained head directory to continue from")
    p.add_argument("--keep-draft-vocab", action="store_true",
                   help="with --init-from: draft over that head's vocabulary instead of re-choosing it from the data")
    p.add_argument("--init", choices=["identity", "last-layer", "random"], default="last-layer")
    p.add_argument("--train-lm-head", action="store_true")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=6)
    p.add_argument("--window", type=int, default=256)
    # Pilots (40 steps): peak 1e-3 reached too fast wrecks the last-layer start (val top-1 0.16);
    # 5e-4 after a slower warmup kept it (0.37).
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-after", type=int, default=0, help="stop at this step (resume later)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=50)
    return p


def main(argv: list[str] | None = None) -> None:
    print(run(parser().parse_args(argv)))


if __name__ == "__main__":
    main()
