"""Self-distillation data for an MTP head: the base model's own greedy answers and hidden states.

For each instruction prompt (kernels/mtp_prompts.py) rendered with the chat template, the frozen
base model answers greedily; every forward it runs anyway yields, per position t, the hidden state
h_t after its final norm and its greedy next token g_t = argmax lm_head(h_t). A training pair at
position t is (h_t, tokens[t+1]) -> target g_{t+1}: the head learns the base's own next-next token.
On the answer tokens[t+1] == g_t, so these pairs are exactly what the head sees when serving.

Storage: one safetensors shard per generation batch under the output directory (written
atomically, so an interrupted run resumes at the next missing shard), plus recipe.json.
    tokens  int32 [N]       all sequences concatenated (prompt + answer)
    hidden  float16 [N, d]  h_t; the last token of each sequence has none (a zero row)
    argmax  int32 [N]       g_t (-1 where there is no h_t)
    starts  int32 [S+1]     sequence boundaries;  prompt_lens int32 [S]
    features float16 [N, n*d]  with --feature-layers (n layers): those decoder layers' outputs at t,
                            from the same forward (kernels/features.py), for fused heads
Each run appends its rate to generation.jsonl: answer tokens generated, wall and CPU seconds
(time.process_time: every thread of the process), tokens per CPU-hour.
Run: `OPENBLAS_NUM_THREADS=1 python -m kernels.mtp_data --out ~/.cache/metrale/mtp/data`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache

from kernels.features import body, check_layers
from kernels.mtp_chat_prompts import chat_prompts
from kernels.loader import output_head
from kernels.mtp_program_prompts import program_prompts
from kernels.mtp_prompts import build_prompts, code_task_prompts, everyday_prompts, recipe

DEFAULT_MODEL = Path.home() / ".cache/metrale/models/SmolLM2-135M-Instruct-f32"
DEFAULT_OUT = Path.home() / ".cache/metrale/mtp/data"


@dataclass
class Trace:
    """One greedy run: tokens [T]; hidden [T, d] and argmax [T] valid for positions < T-1."""

    tokens: list[int]
    hidden: np.ndarray
    argmax: np.ndarray
    prompt_len: int
    features: np.ndarray | None = None  # [T, n*d]: the chosen layers' outputs (rows as hidden)


def load_tokenizer(model_dir: Path | str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def chat_ids(tokenizer, user_text: str) -> list[int]:
    """A one-turn chat rendered with the model's template, encoded as the server encodes it."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=False
    )
    bos = tokenizer.bos_token
    return tokenizer.encode(text, add_special_tokens=bos is None or not text.startswith(bos))


def eos_ids(tokenizer, model_dir: Path | str) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    eos = json.loads((Path(model_dir) / "config.json").read_text()).get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids


def _argmax_rows(lm_head, hidden: mx.array) -> mx.array:
    # One row block at a time: [B, L, 49152] logits at once would take gigabytes.
    return mx.stack([mx.argmax(lm_head(row), axis=-1) for row in hidden]).astype(mx.int32)


def generate_traces(model, prompts: list[list[int]], max_tokens: int, stop: set[int],
                    hidden_dtype: mx.Dtype = mx.float16, layers: tuple[int, ...] = ()) -> list[Trace]:
    """Greedy answers for a batch of prompts (left-padded), keeping every h_t and g_t (and the
    outputs of decoder `layers` at t)."""
    lm_head, width = output_head(model), len(prompts)
    longest = max(len(p) for p in prompts)
    pads = [longest - len(p) for p in prompts]
    cache = [BatchKVCache(pads) for _ in model.model.layers]
    batch = mx.array([[0] * pad + p for pad, p in zip(pads, prompts)])
    hidden, feats = body(model, batch, cache, layers)
    top = _argmax_rows(lm_head, hidden)
    mx.eval(feats, top)
    hiddens = [[np.array(_stored(feats[i, pads[i]:], hidden_dtype))] for i in range(width)]
    argmaxes = [[np.array(top[i, pads[i]:])] for i in range(width)]
    answers: list[list[int]] = [[] for _ in range(width)]
    active = list(range(width))
    last = top[:, -1]
    for _ in range(max_tokens):
        emitted = last.tolist()
        for row, token in zip(active, emitted):
            answers[row].append(token)
        keep = [i for i, (row, token) in enumerate(zip(active, emitted))
                if token not in stop and len(answers[row]) < max_tokens]
        if not keep:
            break
        if len(keep) < len(active):
            # Finished rows leave the batch so they stop costing compute.
            index = mx.array(keep)
            for layer_cache in cache:
                layer_cache.filter(index)
            last, active = last[index], [active[i] for i in keep]
        hidden, feats = body(model, last[:, None], cache, layers)
        last = mx.argmax(lm_head(hidden[:, 0]), axis=-1).astype(mx.int32)
        mx.eval(feats, last)
        step_hidden = np.array(_stored(feats[:, 0], hidden_dtype))
        for i, row in enumerate(active):
            hiddens[row].append(step_hidden[i : i + 1])
            argmaxes[row].append(np.array(last[i : i + 1]))
    dim = model.model.norm.weight.shape[0]
    return [_trace(prompts[i], answers[i], hiddens[i], argmaxes[i], dim) for i in range(width)]


def _stored(rows: mx.array, dtype: mx.Dtype) -> mx.array:
    # Middle layers' residual streams reach ~25,000 here (float16 ends at 65,504): clip, never inf.
    if dtype == mx.float16:
        rows = mx.clip(rows, -65504.0, 65504.0)
    return rows.astype(dtype)


def _trace(prompt, answer, hiddens, argmaxes, dim: int) -> Trace:
    tokens = list(prompt) + answer
    rows, top = np.concatenate(hiddens), np.concatenate(argmaxes)
    # The last emitted token was never fed back, so it has no h_t: pad one empty row.
    rows = np.concatenate([rows, np.zeros((1, rows.shape[1]), rows.dtype)])[: len(tokens)]
    top = np.concatenate([top, np.array([-1], np.int32)])[: len(tokens)]
    # Rows are body()'s features: the chosen layers' outputs, then the final hidden (last d columns).
    extra = rows[:, :-dim] if rows.shape[1] > dim else None
    return Trace(tokens, rows[:, -dim:], top, len(prompt), extra)


def save_shard(traces: list[Trace], path: Path) -> None:
    starts = np.cumsum([0] + [len(t.tokens) for t in traces]).astype(np.int32)
    arrays = {
        "tokens": np.concatenate([np.array(t.tokens, np.int32) for t in traces]),
        "hidden": np.concatenate([t.hidden for t in traces]).astype(np.float16),
        "argmax": np.concatenate([t.argmax for t in traces]).astype(np.int32),
        "starts": starts,
        "prompt_lens": np.array([t.prompt_len for t in traces], np.int32),
    }
    if traces[0].features is not None:
        arrays["features"] = np.concatenate([t.features for t in traces]).astype(np.float16)
    tmp = path.with_name(path.stem + ".tmp.safetensors")
    mx.save_safetensors(str(tmp), {k: mx.array(v) for k, v in arrays.items()})
    tmp.rename(path)  # atomic: a shard is either whole or absent


def load_shards(directory: Path | str) -> list[dict[str, np.ndarray]]:
    paths = sorted(Path(directory).glob("shard-*[0-9].safetensors"))
    return [{k: np.array(v) for k, v in mx.load(str(p)).items()} for p in paths]


def batches_of(prompts: list[list[int]], width: int) -> list[list[int]]:
    """Prompt indices grouped by similar length (little padding), in a fixed order."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    return [order[i : i + width] for i in range(0, len(order), width)]


def build(args: argparse.Namespace) -> None:
    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    from kernels.loader import load

    model = load(args.model).model
    check_layers(model, tuple(args.feature_layers))
    tokenizer = load_tokenizer(args.model)
    prompts, ids = [], []
    answered = answered_prompts(args.exclude_from)
    for prompt in _prompt_source(args):
        if prompt.text in answered:
            continue  # an earlier data folder has this answer already: a repeat would only reweight it
        encoded = chat_ids(tokenizer, prompt.text)
        if len(encoded) <= args.max_prompt_tokens:  # long ones are dropped, never cut mid-template
            prompts.append(prompt)
            ids.append(encoded)
    stop = eos_ids(tokenizer, args.model)
    # Batches run shortest prompts first; --max-shards keeps the first N (a time budget).
    batches = batches_of(ids, args.batch)[: args.max_shards or None]
    used = sorted(i for batch in batches for i in batch)
    _write_recipe(out, args, [prompts[i] for i in used], [ids[i] for i in used])
    layers = tuple(args.feature_layers)
    rate = Rate(args.batch)
    for number, batch in enumerate(batches):
        path = out / f"shard-{number:05d}.safetensors"
        if path.exists():
            continue  # done by an earlier, interrupted run
        rate.start()
        traces = generate_traces(model, [ids[i] for i in batch], args.max_tokens, stop, layers=layers)
        rate.stop(traces)
        save_shard(traces, path)
        print(f"shard {number}: {len(batch)} seqs {sum(len(t.tokens) for t in traces)} tokens "
              f"{rate.last_wall:.1f}s", flush=True)
    if rate.shards:
        with (out / "generation.jsonl").open("a") as log:
            log.write(json.dumps(rate.record()) + "\n")
        print(json.dumps(rate.record()), flush=True)


class Rate:
    """Answer tokens generated per wall second and per CPU-hour, over the shards this run made."""

    def __init__(self, width: int):
        self.width, self.shards, self.answers, self.tokens = width, 0, 0, 0
        self.wall = self.cpu = self.last_wall = 0.0

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self, traces: list[Trace]) -> None:
        self.last_wall = time.perf_counter() - self._wall
        self.wall, self.cpu = self.wall + self.last_wall, self.cpu + time.process_time() - self._cpu
        self.shards, self.answers = self.shards + 1, self.answers + len(traces)
        self.tokens += sum(len(t.tokens) - t.prompt_len for t in traces)

    def record(self) -> dict:
        return {"batch": self.width, "shards": self.shards, "answers": self.answers,
                "generated_tokens": self.tokens, "wall_s": round(self.wall, 1), "cpu_s": round(self.cpu, 1),
                "tokens_per_wall_s": round(self.tokens / max(self.wall, 1e-9), 2),
                "tokens_per_cpu_hour": round(3600 * self.tokens / max(self.cpu, 1e-9))}


def answered_prompts(folders: list[str]) -> set[str]:
    """Prompt texts already answered in these data folders (their prompts.jsonl)."""
    texts = set()
    for folder in folders:
        lines = (Path(folder).expanduser() / "prompts.jsonl").read_text().splitlines()
        texts.update(json.loads(line)["text"] for line in lines if line.strip())
    return texts


def _prompt_source(args: argparse.Namespace):
    if args.set == "stdlib":
        return build_prompts(args.prompts, args.seed)
    if args.set == "code-tasks":
        return code_task_prompts(args.prompts, args.seed)
    if args.set == "chat":
        return chat_prompts(args.prompts, args.seed)
    if args.set == "programs":
        return program_prompts(args.prompts, args.seed)
    return everyday_prompts(args.prompts, args.seed)


def command_line(module: str) -> str:
    """The command as typed: `metrale train-mtp STAGE ...` or `python -m MODULE ...`."""
    args = sys.argv[1:]
    return " ".join(["metrale", *args] if args[:1] == ["train-mtp"] else ["python -m", module, *args])


def _write_recipe(out: Path, args: argparse.Namespace, prompts, ids) -> None:
    record = {
        "command": command_line("kernels.mtp_data"),
        "args": {k: str(v) for k, v in vars(args).items()},
        "prompts": recipe(),
        "set": args.set,
        "templates": dict(sorted(Counter(p.template for p in prompts).items())),
        "sequences": len(prompts),
        "prompt_tokens": sum(len(i) for i in ids),
        "generation": "chat template, greedy, left-padded batches, stop at EOS or max_tokens",
        "feature_layers": list(args.feature_layers),
    }
    (out / "recipe.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "prompts.jsonl").write_text("".join(
        json.dumps({"kind": p.kind, "template": p.template, "text": p.text}) + "\n" for p in prompts))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--set", choices=["stdlib", "everyday", "chat", "code-tasks", "programs"],
                        default="stdlib",
                        help="prompts about the stdlib's code and docs, everyday prose, conversational "
                             "questions (kernels/mtp_chat_prompts.py), programming tasks, or the wider "
                             "programming set (kernels/mtp_program_prompts.py)")
    parser.add_argument("--prompts", type=int, default=800)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--max-prompt-tokens", type=int, default=400)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--feature-layers", type=int, nargs="*", default=[], metavar="N",
                        help="also keep these decoder layers' outputs (0-based), for fused heads")
    parser.add_argument("--exclude-from", nargs="*", default=[], metavar="DIR",
                        help="skip prompts already answered in these data folders")
    # 24 of the 34 batches fit the time budget here (~3 min a batch on one shared core).
    parser.add_argument("--max-shards", type=int, default=24, help="stop after N batches (0: all)")
    build(parser.parse_args(argv))


if __name__ == "__main__":
    main()
