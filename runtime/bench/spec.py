"""metrale bench spec: plain decode vs each drafter at K = 1..8, default model, width 1, greedy.

Two prompt sets (code-like and free chat). For each prompt, plain decode and every drafter/K run back
to back (order rotated per prompt) so machine drift hits all alike; each speculative run must
produce exactly plain decode's tokens. Prints tok/s, speedup over plain and acceptance by position.
Last line: best_speedup_code=R best_speedup_chat=R (best drafter and K over plain).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runtime.bench.common import table

PROMPT_DIR = Path(__file__).resolve().parents[2] / "tests" / "prompts"
FALLBACK = {
    "code": ["Write a Python function that checks whether a string is a palindrome.",
             "Write a Python class for a stack with push, pop and peek.",
             "Write a Python function that merges two sorted lists."],
    "chat": ["What are three tips for sleeping better?", "Describe a sunny day at the beach.",
             "Why do leaves change colour in autumn?"],
}


def prompt_set(name: str, count: int) -> list[str]:
    path = PROMPT_DIR / f"{name}.jsonl"
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        texts = [r["prompt"] if isinstance(r, dict) else r for r in rows]
    else:
        texts = FALLBACK[name]
    return texts[:count]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench spec", description=__doc__)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per set")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--drafters", default="ngram,mtp", help="mtp runs only where a head is found")
    args = parser.parse_args(argv)
    return run(args.prompts, args.max_tokens, [int(k) for k in args.ks.split(",")], args.drafters.split(","))


def run(count: int, max_tokens: int, ks: list[int], drafters: list[str]) -> int:
    from kernels.default_model import ensure_default_model
    from kernels.engine import Engine
    from kernels.heads import build_drafter, find_mtp_head
    from kernels.loader import load
    from runtime.text import TextCodec

    model_dir = ensure_default_model()
    model, codec = load(model_dir).model, TextCodec(model_dir)
    engines = {"plain": Engine(model), "ngram": Engine(model)}
    if "mtp" in drafters and find_mtp_head(model_dir) is not None:
        engines["mtp"] = Engine(model, drafter=build_drafter("mtp", model, model_dir, None, None)[1])
    configs = [("plain", 0)] + [(d, k) for d in drafters if d in engines for k in ks]
    best = {}
    for set_name in ("code", "chat"):
        totals = sweep(engines, configs, prompt_set(set_name, count), max_tokens, codec, set_name)
        best[set_name] = _report(set_name, totals)
    print(f"best_speedup_code={best['code']:.3f} best_speedup_chat={best['chat']:.3f}")
    return 0


def sweep(engines: dict, configs: list[tuple[str, int]], texts: list[str], max_tokens: int, codec,
          set_name: str) -> dict:
    """Per (drafter, K): [tokens, seconds, drafted by position, accepted by position], summed over
    the prompts. Every config runs on every prompt back to back, in an order rotated per prompt,
    and each speculative run must reproduce plain decode's tokens exactly."""
    from kernels.spec_bench import generate

    depth = max(k for _, k in configs) or 1
    totals = {c: [0, 0.0, [0] * depth, [0] * depth] for c in configs}
    for i, text in enumerate(texts):
        ids = codec.encode(codec.chat_text(_chat(text)))
        generate(engines["plain"], ids, 4, "plain", 0, codec.eos_ids)  # warm-up
        order = configs[i % len(configs):] + configs[:i % len(configs)]
        results = {c: generate(engines[c[0]], ids, max_tokens, c[0], c[1], codec.eos_ids) for c in order}
        reference = results[("plain", 0)].tokens
        for config, result in results.items():
            if result.tokens != reference:
                raise AssertionError(f"{config} changed greedy output on {set_name} prompt {i}")
            t = totals[config]
            t[0], t[1] = t[0] + len(result.tokens), t[1] + result.seconds
            for p, (d, a) in enumerate(zip(result.drafted, result.accepted)):
                t[2][p], t[3][p] = t[2][p] + d, t[3][p] + a
    return totals


def _report(set_name: str, totals: dict) -> float:
    plain_rate = totals[("plain", 0)][0] / totals[("plain", 0)][1]
    rows, best = [], 0.0
    for (drafter, k), (tokens, seconds, drafted, accepted) in totals.items():
        rate = tokens / seconds
        acceptance = " ".join(f"{a / d:.2f}" for d, a in zip(drafted[:k], accepted[:k]) if d) or "-"
        rows.append([set_name, drafter, k, tokens, rate, rate / plain_rate, acceptance])
        if drafter != "plain":
            best = max(best, rate / plain_rate)
    print(table(["set", "drafter", "K", "tokens", "tok_s", "speedup", "acceptance_by_position"], rows))
    print()
    return best


def _chat(text: str):
    from runtime.messages import ChatMessage

    return (ChatMessage(role="user", content=text),)
