"""metrale bench hyper: hyper mode on the served path, against serial mode and with its tree executor.

Fresh `metrale serve` subprocesses on loopback (the converted default model, fresh cache folders),
driven by the official openai client with greedy chat completions, after two untimed warm-ups each:
1. parity: serial mode vs hyper mode at width 1 (`--hyper-width-executor none`), both speculating at
   every step at K=3 (`--mtp-gate force --spec-cost-model off`), so which step runs is fixed by the
   tokens alone and the trajectory can be compared: every request streams, and its trajectory is the
   text of each streamed chunk (one per step) and its receipt's counts (drafted and accepted by
   position, verify and plain steps). Prompts alternate between the held-out chat and code sets
   (tests/prompts/), each sent to both servers back to back, the order alternating.
2. tree: hyper at width 1 vs hyper with the tree executor (the default), both at the default
   settings otherwise (the online controller chooses depths, the tree planner widths), on the
   held-out chat and code sets, interleaved the same way. Mean accepted drafts per verify step from
   the receipts, for the chain and for the tree; outputs must be identical (greedy).
3. layout: in this process, what verifying a tree costs in each layout of kernels/tree_verify.py
   (one row with a tree mask, or one row per branch over a copied prefix) against plain decode and a
   chain of as many tokens (kernels/tree_probe.py).
Each prompt runs --repeats times on each server, in ABBA order (A B, then B A, ...); its time on a
server is its fastest run, the one least disturbed by other work on a shared machine (every run's
text must still agree). Ratios are summed tokens over summed seconds. Last line:
parity_ratio=R (hyper width 1 tok/s / serial tok/s) identical=0|1 (every trajectory hash equal and
every tree output equal to the chain's) tree_speedup_chat=R tree_speedup_code=R (tree tok/s / width 1).
--plot FILE.png draws the tree's per-prompt speedup over the chain along each set, every server's
tok/s per set, and the layouts' verify cost over a plain step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass

from runtime.bench import _plot
from runtime.bench.common import table

FORCED = ["--mtp-gate", "force", "--spec-cost-model", "off", "--num-draft-tokens", "3"]
SERIAL, HYPER_W1 = ["--scheduler-mode", "serial"], ["--scheduler-mode", "hyper", "--hyper-width-executor", "none"]
HYPER_TREE = ["--scheduler-mode", "hyper", "--hyper-width-executor", "tree"]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="metrale bench hyper", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=20, help="parity: prompts, alternating chat and code (>= 20)")
    p.add_argument("--tree-prompts", type=int, default=20, help="tree: the first N prompts of each set")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=2, help="runs of each prompt on each server (ABBA order)")
    p.add_argument("--layout-rounds", type=int, default=10, help="layout probe rounds; 0 skips it")
    p.add_argument("--plot", metavar="FILE.png", help="draw per-prompt tree speedups, tok/s and layout costs")
    args = p.parse_args(argv)
    if args.plot:
        _plot.pyplot("metrale bench hyper")  # fail before measuring, not after
    from kernels.default_model import ensure_default_model
    from runtime.bench.spec import prompt_set

    model_dir = ensure_default_model()
    chat, code = prompt_set("chat", max(args.prompts, args.tree_prompts)), prompt_set("code", max(args.prompts, args.tree_prompts))
    mixed = [q for pair in zip(chat, code) for q in pair][:args.prompts]
    parity = pair_run(model_dir, {"serial": SERIAL + FORCED, "hyper_w1": HYPER_W1 + FORCED}, {"mixed": mixed},
                      args.max_tokens, args.repeats, stream=True)
    tree = pair_run(model_dir, {"hyper_w1": HYPER_W1, "hyper_tree": HYPER_TREE},
                    {"chat": chat[:args.tree_prompts], "code": code[:args.tree_prompts]}, args.max_tokens,
                    args.repeats)
    layout = None
    if args.layout_rounds:
        from kernels.tree_probe import layout_costs

        layout = layout_costs(model_dir, rounds=args.layout_rounds)
    text = report(parity, tree, layout)
    print(text)
    if args.plot:
        plot(*curves(parity, tree), layout, text.splitlines()[-1], args.plot)
    return 0


@dataclass(frozen=True)
class Answer:
    seconds: float
    tokens: int
    text: str
    receipt: dict
    chunks: tuple[str, ...] = ()  # streamed: one per step

    def trajectory(self) -> list:
        counts = {k: v for k, v in self.receipt.items() if not k.endswith("_seconds")}
        return [list(self.chunks), counts]


def pair_run(model_dir, servers: dict[str, list[str]], sets: dict[str, list[str]], max_tokens: int,
             repeats: int, stream: bool = False) -> dict[str, dict[str, list[Answer]]]:
    """Both servers up together; every prompt to each, back to back, in ABBA order; per prompt and
    server the fastest run, after checking that every run gave the same trajectory."""
    from contextlib import ExitStack

    from runtime.bench._served import ServedProcess, openai_client, warm_up

    with ExitStack() as stack:
        clients = {}
        for name, flags in servers.items():
            server = stack.enter_context(ServedProcess(model_dir, flags))
            print(f"{name}: metrale serve {' '.join(flags)}", flush=True)
            clients[name] = openai_client(server.url)
            warm_up(clients[name], max_tokens, plain_too=False)
        out = {name: {s: [] for s in sets} for name in servers}
        names = list(servers)
        for set_name, prompts in sets.items():
            for i, prompt in enumerate(prompts):
                runs = {name: [] for name in names}
                for r in range(repeats):
                    for name in (names if (i + r) % 2 == 0 else names[::-1]):
                        runs[name].append(ask(clients[name], prompt, max_tokens, stream))
                for name, answers in runs.items():
                    out[name][set_name].append(fastest(answers))
    return out


def fastest(answers: list[Answer]) -> Answer:
    """The least disturbed run; the runs must agree (greedy, same server)."""
    if any(a.text != answers[0].text for a in answers):
        raise RuntimeError("a prompt's repeated runs on one server gave different outputs")
    return min(answers, key=lambda a: a.seconds)


def ask(client, prompt: str, max_tokens: int, stream: bool) -> Answer:
    messages = [{"role": "user", "content": prompt}]
    started = time.perf_counter()
    if not stream:
        resp = client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                              temperature=0, stream=False)
        receipt = (resp.usage.model_extra or {}).get("speculation") or {}
        return Answer(time.perf_counter() - started, resp.usage.completion_tokens,
                      resp.choices[0].message.content or "", dict(receipt))
    chunks, usage = [], None
    for chunk in client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            chunks.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    receipt = (usage.model_extra or {}).get("speculation") or {}
    return Answer(time.perf_counter() - started, usage.completion_tokens, "".join(chunks), dict(receipt),
                  tuple(chunks))


def tok_s(answers: list[Answer]) -> float:
    return sum(a.tokens for a in answers) / sum(a.seconds for a in answers)


def accepted_per_verify(answers: list[Answer]) -> float:
    verify = sum(a.receipt.get("verify_steps", 0) for a in answers)
    return sum(a.receipt.get("accepted_tokens", 0) for a in answers) / verify if verify else float("nan")


def spec_share(answers: list[Answer]) -> float:
    verify = sum(a.receipt.get("verify_steps", 0) for a in answers)
    steps = verify + sum(a.receipt.get("plain_steps", 0) for a in answers)
    return verify / steps if steps else float("nan")


def digest(answers: list[Answer]) -> str:
    return hashlib.sha256(json.dumps([a.trajectory() for a in answers]).encode()).hexdigest()[:16]


def report(parity: dict, tree: dict, layout: list[dict] | None) -> str:
    lines = []
    serial, w1 = parity["serial"]["mixed"], parity["hyper_w1"]["mixed"]
    ratio = tok_s(w1) / tok_s(serial)
    same_trajectory = digest(serial) == digest(w1)
    rows = [[name, len(a), sum(x.tokens for x in a), tok_s(a), spec_share(a), accepted_per_verify(a), digest(a)]
            for name, a in (("serial", serial), ("hyper_w1", w1))]
    lines += [f"parity ({len(serial)} prompts, chat and code alternating, K=3 forced)",
              table(["server", "prompts", "tokens", "tok_s", "spec_steps", "accepted_per_verify", "trajectory"],
                    rows), f"hyper_w1 / serial tok/s = {ratio:.3f}; trajectories identical: {same_trajectory}", ""]
    speedups, same_outputs = {}, True
    for set_name in tree["hyper_w1"]:
        chain, widened = tree["hyper_w1"][set_name], tree["hyper_tree"][set_name]
        speedups[set_name] = tok_s(widened) / tok_s(chain)
        same = sum(a.text == b.text for a, b in zip(chain, widened))
        same_outputs &= same == len(chain)
        rows = [[name, sum(x.tokens for x in a), tok_s(a), spec_share(a), accepted_per_verify(a),
                 sum(x.receipt.get("verify_steps", 0) for x in a)] for name, a in (("chain", chain), ("tree", widened))]
        lines += [f"tree vs chain, {set_name} ({len(chain)} prompts, default settings)",
                  table(["executor", "tokens", "tok_s", "spec_steps", "accepted_per_verify", "verify_steps"], rows),
                  f"tree / chain tok/s = {speedups[set_name]:.3f}; outputs identical {same}/{len(chain)}", ""]
    if layout:
        lines += ["verify cost of a tree by layout, over a plain step (fastest round; median in brackets)",
                  table(["context", "cell", "min_ratio", "median_ratio", "plain_ms"],
                        [[c["context"], c["cell"], c["min_ratio"], c["median_ratio"], c["plain_ms"]] for c in layout]),
                  ""]
    identical = int(same_trajectory and same_outputs)
    lines.append(f"parity_ratio={ratio:.3f} identical={identical} tree_speedup_chat={speedups.get('chat', float('nan')):.3f} "
                 f"tree_speedup_code={speedups.get('code', float('nan')):.3f}")
    return "\n".join(lines)


def curves(parity: dict, tree: dict) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """Plain data for plot(): per set, the tree's speedup over the chain prompt by prompt; per set,
    each server's tok/s (the parity servers, K=3 forced, under "K=3")."""
    speedup = {s: [c.seconds / t.seconds for c, t in zip(tree["hyper_w1"][s], tree["hyper_tree"][s])]
               for s in tree["hyper_w1"]}
    rates = {"K=3": {name: tok_s(parity[name]["mixed"]) for name in parity}}
    rates.update({s: {"chain": tok_s(tree["hyper_w1"][s]), "tree": tok_s(tree["hyper_tree"][s])} for s in tree["hyper_w1"]})
    return speedup, rates


def plot(speedup: dict[str, list[float]], rates: dict[str, dict[str, float]], layout: list[dict] | None,
         last: str, path: str) -> None:
    """Left: the tree's per-prompt speedup along each set; middle: tok/s by server and set; right:
    each layout's verify cost over a plain step, where the layout probe ran."""
    fig, (row,) = _plot.figure("metrale bench hyper", "bench hyper: width 1 against serial, trees against chains",
                               cols=3, size=(15, 4.6))
    left, middle, right = row
    for set_name, values in speedup.items():
        left.plot(range(1, len(values) + 1), values, marker="o", label=set_name)
    _plot.even(left, "chain")
    left.set(title="tree / chain per prompt", xlabel="prompt in set order", ylabel="chain s / tree s")
    left.xaxis.get_major_locator().set_params(integer=True)
    left.legend(fontsize=8)
    bars = [(group, name, rate) for group, by_name in rates.items() for name, rate in by_name.items()]
    colours = {group: f"C{i}" for i, group in enumerate(rates)}
    drawn = middle.bar(range(len(bars)), [rate for _, _, rate in bars], color=[colours[g] for g, _, _ in bars])
    middle.bar_label(drawn, fmt="%.1f", fontsize=7)
    middle.set_xticks(range(len(bars)), labels=[f"{name}\n{group}" for group, name, _ in bars], fontsize=7)
    middle.set(title="tok/s by server", ylabel="tok/s")
    if layout:
        labels = [f"{c['cell']}\n@{c['context']}" for c in layout]
        right.bar(range(len(layout)), [c["min_ratio"] for c in layout])
        right.set_xticks(range(len(layout)), labels=labels, fontsize=6, rotation=60)
        _plot.even(right, "plain step")
        right.set(title="verify cost over a plain step (fastest round)", ylabel="ratio")
    else:
        right.set_axis_off()
    _plot.save(fig, path, last)
