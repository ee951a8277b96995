"""metrale bench spec: plain decode vs each drafter at K = 1..8, default model, width 1, greedy.

Through the served actor system in this process (runtime/bench/_inprocess.py): each (drafter, K) is
a System configured as `metrale serve --drafter D --num-draft-tokens K --mtp-gate force
--spec-cost-model off` (serial mode), and plain decode is a request with disable_mtp on the same
systems. Against a kernel loop each step pays a few queue hops and one owner hand-off (~0.1 ms of
a ~60-90 ms step). One drafter at a time: its systems (one per K, ~0.7 GB each) run side by side,
and on each prompt plain decode and every K run back to back, in an order rotated per prompt, so
machine drift hits all alike; each speculative run must produce exactly plain decode's tokens.
Two prompt sets (code-like and free chat). Prints tok/s, speedup over the plain runs beside it
(pooled over the prompts, and the median of per-prompt speedups) and acceptance by position.
Last line: best_speedup_code=R best_speedup_chat=R (the best drafter and K, pooled)
median_speedup_code=R median_speedup_chat=R (that same cell's median over prompts: one lucky
prompt cannot carry it). --plot FILE.png draws speedup against K, per drafter and set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from runtime.bench import _plot
from runtime.bench.common import table

PROMPT_DIR = Path(__file__).resolve().parents[2] / "tests" / "prompts"
FALLBACK = {
    "code": ["Write a Python function that checks whether a string is a palindrome.",
             "Write a Python class for a stack with push, pop and peek.",
             "Write a Python function that merges two sorted lists."],
    "chat": ["What are three tips for sleeping better?", "Describe a sunny day at the beach.",
             "Why do leaves change colour in autumn?"],
}
PLAIN = ("plain", 0)


def prompt_set(name: str, count: int) -> list[str]:
    path = PROMPT_DIR / f"{name}.jsonl"
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        texts = [r["prompt"] if isinstance(r, dict) else r for r in rows]
    else:
        texts = FALLBACK[name]
    return texts[:count]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench spec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per set")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--drafters", default="ngram,mtp", help="mtp runs only where a head is found")
    parser.add_argument("--plot", metavar="FILE.png", help="draw speedup against K (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.plot:
        _plot.pyplot(parser.prog)  # fail before measuring, not after
    ks = [int(k) for k in args.ks.split(",")]
    return asyncio.run(run(args.prompts, args.max_tokens, ks, args.drafters.split(","), args.plot))


async def run(count: int, max_tokens: int, ks: list[int], drafters: list[str], plot_path: str | None = None) -> int:
    from kernels.default_model import ensure_default_model
    from kernels.heads import find_mtp_head

    model_dir = ensure_default_model()
    drafters = [d for d in drafters if d != "mtp" or find_mtp_head(model_dir) is not None]
    sets = {name: prompt_set(name, count) for name in ("code", "chat")}
    phases = {d: await phase(model_dir, d, ks, sets, max_tokens) for d in drafters}
    best = {name: _report(name, {d: runs[name] for d, runs in phases.items()}) for name in sets}
    last = (f"best_speedup_code={best['code'][0]:.3f} best_speedup_chat={best['chat'][0]:.3f} "
            f"median_speedup_code={best['code'][1]:.3f} median_speedup_chat={best['chat'][1]:.3f}")
    print(last)
    if plot_path:
        plot({name: {d: curve(runs[name]) for d, runs in phases.items()} for name in sets}, last, plot_path)
    return 0


async def phase(model_dir, drafter: str, ks: list[int], sets: dict[str, list], max_tokens: int,
                mtp_head: str | None = None) -> dict[str, dict]:
    """One drafter's systems (one per K), started together; every set swept through them.
    Per set: (drafter, K) -> one Result per prompt, PLAIN included."""
    from runtime.bench._inprocess import fixed_depth, served_all
    from runtime.config import load_config

    configs = {(drafter, k): fixed_depth(load_config(), drafter, k, mtp_head) for k in ks}
    async with served_all(configs, model_dir) as clients:
        clients = {PLAIN: clients[(drafter, ks[0])], **clients}
        first = next(iter(sets.values()))[:1]
        await sweep(clients, first, 8, "warm-up")  # untimed: each system builds its paths once
        return {name: await sweep(clients, texts, max_tokens, name) for name, texts in sets.items()}


async def sweep(clients: dict, prompts: list, max_tokens: int, set_name: str) -> dict[tuple, list]:
    """Every configuration on every prompt, back to back in an order rotated per prompt; PLAIN
    runs with disable_mtp. Each speculative run must reproduce plain decode's tokens exactly."""
    from runtime.bench._inprocess import plain
    from runtime.messages import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    configs = list(clients)
    runs: dict[tuple, list] = {c: [] for c in configs}
    for i, prompt in enumerate(prompts):
        shift = i % len(configs)
        for config in configs[shift:] + configs[:shift]:
            params = plain(greedy) if config == PLAIN else greedy
            runs[config].append(await clients[config].generate(prompt, params))
        reference = runs[PLAIN][-1].tokens
        changed = [c for c in configs if runs[c][-1].tokens != reference]
        if changed:
            raise AssertionError(f"{changed} changed greedy output on {set_name} prompt {i}")
    return runs


def pooled(results: list) -> tuple[int, float]:
    """Tokens and seconds over a cell's prompts."""
    return sum(len(r.tokens) for r in results), sum(r.seconds for r in results)


def speedups(results: list, plain_results: list) -> tuple[float, float]:
    """(pooled tok/s over plain's, median over prompts of the per-prompt ratio)."""
    tokens, seconds = pooled(results)
    plain_tokens, plain_seconds = pooled(plain_results)
    per_prompt = [(len(r.tokens) / r.seconds) / (len(p.tokens) / p.seconds) for r, p in zip(results, plain_results)]
    return (tokens / seconds) / (plain_tokens / plain_seconds), statistics.median(per_prompt)


def by_position(results: list, k: int) -> tuple[list[int], list[int]]:
    """Drafted and accepted tokens by draft position, summed over the prompts' receipts."""
    drafted, accepted = [0] * k, [0] * k
    for r in results:
        for p, (d, a) in enumerate(zip(r.receipt.drafted_by_position, r.receipt.accepted_by_position)):
            drafted[p], accepted[p] = drafted[p] + d, accepted[p] + a
    return drafted, accepted


def _report(set_name: str, phases: dict[str, dict]) -> tuple[float, float]:
    """Prints the set's table; returns the best cell's (pooled, median) speedup."""
    rows, best = [], (0.0, 0.0)
    for drafter, runs in phases.items():
        plain_runs = runs[PLAIN]
        for (kind, k), results in runs.items():
            tokens, seconds = pooled(results)
            pooled_x, median_x = speedups(results, plain_runs)
            drafted, accepted = by_position(results, k)
            acceptance = " ".join(f"{a / d:.2f}" for d, a in zip(drafted, accepted) if d) or "-"
            name = f"plain/{drafter}" if kind == "plain" else kind
            rows.append([set_name, name, k, tokens, tokens / seconds, pooled_x, median_x, acceptance])
            if kind != "plain" and pooled_x > best[0]:
                best = (pooled_x, median_x)
    print(table(["set", "drafter", "K", "tokens", "tok_s", "speedup", "median_speedup", "acceptance_by_position"],
                rows))
    print()
    return best


def curve(runs: dict[tuple, list]) -> list[tuple[int, float, float]]:
    """One drafter on one set: (K, pooled speedup, median speedup) per K, plain left out."""
    return [(k, *speedups(results, runs[PLAIN])) for (kind, k), results in runs.items() if kind != "plain"]


def plot(curves: dict[str, dict[str, list[tuple[int, float, float]]]], last: str, path: str) -> None:
    """curves: set -> drafter -> curve(); one panel per set, pooled solid and median dashed."""
    fig, axes = _plot.figure("metrale bench spec", "bench spec: speedup over plain decode against K",
                             cols=len(curves), size=(5.5 * len(curves), 4.5))
    for ax, (set_name, by_drafter) in zip(axes[0], curves.items()):
        for drafter, points in by_drafter.items():
            ks, pooled_x, median_x = zip(*points)
            line, = ax.plot(ks, pooled_x, marker="o", label=f"{drafter} pooled")
            ax.plot(ks, median_x, marker=".", linestyle="--", color=line.get_color(), label=f"{drafter} median")
        _plot.even(ax, "plain decode")
        ax.set_xticks(sorted({k for points in by_drafter.values() for k, _, _ in points}))
        ax.set_title(f"{set_name} prompts")
        ax.set_xlabel("K (draft tokens per step)")
        ax.set_ylabel("speedup (tok/s over plain)")
        ax.legend(fontsize=8)
    _plot.save(fig, path, last)
