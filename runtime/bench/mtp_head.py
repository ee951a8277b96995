"""metrale bench mtp-head: the default model's MTP head on held-out prompts, width 1, greedy.

Prompt sets tests/prompts/chat.jsonl and code.jsonl were kept out of training. For each prompt,
plain decode and MTP speculation at K = 1..4 run back to back (order rotated per prompt), and every
speculative run must reproduce plain decode's tokens. Prints, per set and K: tok/s of plain vs MTP
on the same prompts, the speedup, acceptance by draft position (a_i: drafts 1..i all accepted) and
the head's drafting cost per verify step. Last line:
accept1_chat=A accept1_code=A speedup_chat=R speedup_code=R (first-position acceptance over all
runs; speedup at the best K).
"""

from __future__ import annotations

import argparse

from runtime.bench.common import table
from runtime.bench.spec import prompt_set, sweep


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench mtp-head", description=__doc__)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set (chat: 36, code: 34 held)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ks", default="1,2,3,4")
    parser.add_argument("--head", default=None, help="a head folder (default: the one shipped for the model)")
    args = parser.parse_args(argv)
    return run(args.prompts, args.max_tokens, [int(k) for k in args.ks.split(",")], args.head)


def run(count: int, max_tokens: int, ks: list[int], head: str | None) -> int:
    from kernels.default_model import ensure_default_model
    from kernels.engine import Engine
    from kernels.heads import build_drafter, find_mtp_head
    from kernels.loader import load
    from kernels.mtp_eval import draft_ms
    from runtime.text import TextCodec

    model_dir = ensure_default_model()
    if find_mtp_head(model_dir, head) is None:
        print(f"no MTP head for {model_dir.name}: give --head PATH")
        return 2
    model, codec = load(model_dir).model, TextCodec(model_dir)
    drafter = build_drafter("mtp", model, model_dir, None, head)[1]
    engines = {"plain": Engine(model), "mtp": Engine(model, drafter=drafter)}
    cost_ms = {k: draft_ms(model, drafter.head, k) for k in ks}
    configs = [("plain", 0)] + [("mtp", k) for k in ks]
    figures = {}
    for set_name in ("chat", "code"):
        totals = sweep(engines, configs, prompt_set(set_name, count), max_tokens, codec, set_name)
        figures[set_name] = _report(set_name, totals, cost_ms)
    print(" ".join(f"accept1_{s}={figures[s][0]:.3f}" for s in ("chat", "code")) + " "
          + " ".join(f"speedup_{s}={figures[s][1]:.3f}" for s in ("chat", "code")))
    return 0


def _report(set_name: str, totals: dict, cost_ms: dict) -> tuple[float, float]:
    """Prints the set's table; returns (first-position acceptance, best speedup)."""
    plain_tokens, plain_seconds = totals[("plain", 0)][:2]
    plain_rate = plain_tokens / plain_seconds
    rows, best, first = [], 0.0, [0, 0]
    for (kind, k), (tokens, seconds, drafted, accepted) in totals.items():
        if kind == "plain":
            continue
        rate = tokens / seconds
        best = max(best, rate / plain_rate)
        first = [first[0] + drafted[0], first[1] + accepted[0]]
        by_position = " ".join(f"{a / d:.2f}" for d, a in zip(drafted[:k], accepted[:k]) if d) or "-"
        steps = drafted[0]
        rows.append([set_name, k, tokens, plain_rate, rate, rate / plain_rate, by_position,
                     tokens / steps if steps else float("nan"), cost_ms[k], 1000 * plain_seconds / plain_tokens])
    print(table(["set", "K", "tokens", "plain_tok_s", "mtp_tok_s", "speedup", "acceptance_by_position",
                 "tokens_per_verify", "draft_ms", "plain_step_ms"], rows))
    print()
    return (first[1] / first[0] if first[0] else 0.0), best
