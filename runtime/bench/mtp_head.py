"""metrale bench mtp-head: the default model's MTP head on held-out prompts, width 1, greedy.

Prompt sets tests/prompts/chat.jsonl and code.jsonl were kept out of training. Through the served
actor system in this process, as `metrale bench spec` runs it (one System per K, serial mode, gate
forced, no planner; plain decode is a request with disable_mtp; each step pays a few queue hops,
~0.1 ms of a ~60-90 ms step): on each prompt plain decode and MTP speculation at K = 1..4 run back
to back (order rotated per prompt), and every speculative run must reproduce plain decode's tokens.
Prints, per set and K: tok/s of plain vs MTP on the same prompts, the speedup (pooled, and the
median of per-prompt speedups), acceptance by draft position (a_i: drafts 1..i all accepted) and
the head's drafting cost per verify step (a kernel probe). Last line:
accept1_chat=A accept1_code=A speedup_chat=R speedup_code=R (first-position acceptance over all
runs; pooled speedup at the best K) median_speedup_chat=R median_speedup_code=R (that K's median
over prompts).
"""

from __future__ import annotations

import argparse
import asyncio

from runtime.bench.common import table
from runtime.bench.spec import PLAIN, by_position, phase, pooled, prompt_set, speedups


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench mtp-head", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set (chat: 36, code: 34 held)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ks", default="1,2,3,4")
    parser.add_argument("--head", default=None, help="a head folder (default: the one shipped for the model)")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.prompts, args.max_tokens, [int(k) for k in args.ks.split(",")], args.head))


async def run(count: int, max_tokens: int, ks: list[int], head: str | None) -> int:
    from kernels.default_model import ensure_default_model
    from kernels.heads import find_mtp_head

    model_dir = ensure_default_model()
    if find_mtp_head(model_dir, head) is None:
        print(f"no MTP head for {model_dir.name}: give --head PATH")
        return 2
    cost_ms = _draft_ms(model_dir, head, ks)
    sets = {name: prompt_set(name, count) for name in ("chat", "code")}
    runs = await phase(model_dir, "mtp", ks, sets, max_tokens, mtp_head=head)
    figures = {name: _report(name, runs[name], cost_ms) for name in sets}
    print(" ".join(f"accept1_{s}={figures[s][0]:.3f}" for s in ("chat", "code")) + " "
          + " ".join(f"speedup_{s}={figures[s][1]:.3f}" for s in ("chat", "code")) + " "
          + " ".join(f"median_speedup_{s}={figures[s][2]:.3f}" for s in ("chat", "code")))
    return 0


def _draft_ms(model_dir, head: str | None, ks: list[int]) -> dict[int, float]:
    """The head's drafting cost at each K, timed on its own (kernels/mtp_eval.py)."""
    from kernels.heads import build_drafter
    from kernels.loader import load
    from kernels.mtp_eval import draft_ms

    model = load(model_dir).model
    drafter = build_drafter("mtp", model, model_dir, None, head)[1]
    return {k: draft_ms(model, drafter.head, k) for k in ks}


def _report(set_name: str, runs: dict, cost_ms: dict) -> tuple[float, float, float]:
    """Prints the set's table; returns (first-position acceptance, best pooled speedup, its median)."""
    plain_tokens, plain_seconds = pooled(runs[PLAIN])
    plain_rate = plain_tokens / plain_seconds
    rows, best, first = [], (0.0, 0.0), [0, 0]
    for (kind, k), results in runs.items():
        if kind == "plain":
            continue
        tokens, seconds = pooled(results)
        speedup, median = speedups(results, runs[PLAIN])
        best = max(best, (speedup, median))
        drafted, accepted = by_position(results, k)
        first = [first[0] + drafted[0], first[1] + accepted[0]]
        acceptance = " ".join(f"{a / d:.2f}" for d, a in zip(drafted, accepted) if d) or "-"
        steps = sum(r.receipt.verify_steps for r in results)
        rows.append([set_name, k, tokens, plain_rate, tokens / seconds, speedup, median, acceptance,
                     tokens / steps if steps else float("nan"), cost_ms[k], 1000 * plain_seconds / plain_tokens])
    print(table(["set", "K", "tokens", "plain_tok_s", "mtp_tok_s", "speedup", "median_speedup",
                 "acceptance_by_position", "tokens_per_verify", "draft_ms", "plain_step_ms"], rows))
    print()
    return (first[1] / first[0] if first[0] else 0.0), best[0], best[1]
