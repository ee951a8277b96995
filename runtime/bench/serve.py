"""metrale bench serve: what a user gets on the served path, speculation on vs off.

Each run is a fresh `metrale serve` subprocess on loopback (the converted default model, a fresh
empty cache folder, so no cost table learned by an earlier run is found; the shipped one may be),
driven with the official openai client: greedy non-streaming chat completions over the held-out
prompt sets (tests/prompts/chat.jsonl, code.jsonl; the first --prompts of each), after two untimed
warm-up requests and its start-up check of its cost prior (seconds, in its idle moments; the next
server starts after it, so no check times its cells beside another server's loading). Every run's
server is up at once (an idle one costs nothing), and each prompt goes to every run's legs back to
back: the runs in an order rotated from one prompt to the next, each run's two legs adjacent, plain
first for every other prompt, so a slow spell of this shared machine hits every run alike, each
ratio compares times taken seconds apart, and neither leg usually goes first. With --repeats R each
prompt's legs run R times, the order reversed each time, and a leg's time is its fastest (a shared
machine's stalls only ever add time; every repeat's output is compared with plain decode). Requests
carry `"cache_prompt": false`, so each computes its prompt as the first repeat did. Runs:
- served: the default settings. Every prompt is sent once with speculation and once with
  `disable_mtp`. With --objectives, also one run per other objective named (`served:latency`,
  `served:energy`): the same server settings, its requests carrying that `objective` field.
- foreign: the same, with `--machine-id` set to another machine, so the shipped calibration table
  does not count as measured here (what a user on a new machine gets). Skipped, with a note, where
  `metrale serve` has no --machine-id.
- K=k: `--mtp-gate force --spec-cost-model off --num-draft-tokens k`, each prompt also sent once with
  and once without speculation. Every run is compared with its own server's plain requests: two
  servers of identical settings ran 1-4% apart in tok/s here (where each process's memory landed),
  which is as large as the differences between depths this compares.
- A/A (--control): the served server with both legs plain. Its worst5 is how far two identical
  systems' windows fall apart on this machine: the floor to read every other worst5 against.
With --clients C, prompts go in groups of C concurrent requests (all speculative, then all plain,
the order alternating per group) and timings are the group's wall time.

How to read the table (one per set): `speedup` is summed plain seconds over summed speculative
seconds, so above 1.0 speculation paid; `worst5` is the same ratio over the worst window of 5
consecutive prompts (groups covering about 5 at --clients > 1): how bad a stretch gets.
`spec_steps` is the share of decode steps that speculated (verify / (verify + plain) from each
response's `usage.speculation` receipt); `acc1..acc4` are accepted / drafted tokens at draft
positions 1..4; `identical` counts outputs byte-identical to plain decode (greedy must give all).
Then per set the best fixed K (highest speedup) and the served speedup over it: near 1.0 means the
controller found the best depth on its own. Last line: served_speedup_chat=R
served_speedup_code=R served_vs_best_fixed_min=R [foreign_speedup_chat=R foreign_speedup_code=R]
[control_worst5_min=R] identical=0|1 (1 only if every compared output of every run matched plain).
--plot FILE.png draws each run's per-prompt speedup along each set and its tok/s.
"""

from __future__ import annotations

import argparse
import math
import shlex
from itertools import cycle
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from runtime.bench import _plot
from runtime.bench.common import table

FOREIGN_MACHINE = "Linux-x86_64 | Foreign Test CPU | 2 cpus"
POSITIONS = 4  # acceptance columns
WINDOW = 5  # prompts per window of worst5
CONTROL = "A/A"  # --control: the served server, both legs plain


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.plot:
        _plot.pyplot("metrale bench serve")  # fail before measuring, not after
    from kernels.default_model import ensure_default_model
    from runtime.bench.spec import prompt_set

    sets = {name: prompt_set(name, args.prompts) for name in args.sets.split(",") if name}
    model_dir = ensure_default_model()
    paired = measure(model_dir, plan(args), sets, args)
    text = report(paired, sets, args.clients)
    print(text)
    if args.plot:
        plot(*curves(paired, sets), text.splitlines()[-1], args.plot)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metrale bench serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=20, help="the first N prompts of each set")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--sets", default="chat,code")
    p.add_argument("--fixed-k", default="1,2,3,4", help="K of the fixed-depth runs; empty: none")
    p.add_argument("--skip-foreign", action="store_true")
    p.add_argument("--objectives", default="balanced", type=_objectives,
                   help="request objectives of the served runs (comma list; balanced is the default run)")
    p.add_argument("--scheduler-mode", choices=("serial", "mtp_batch"), help="passed to every server")
    p.add_argument("--clients", type=int, default=1,
                   help="concurrent requests per group (pair with --scheduler-mode mtp_batch and "
                        "--extra-serve-args '--max-active-requests C')")
    p.add_argument("--repeats", type=int, default=1,
                   help="each group's legs this many times, the order reversed each time; a leg's time is "
                        "its fastest (a shared machine's stalls only ever add time)")
    p.add_argument("--control", action="store_true",
                   help=f"add an {CONTROL} run: the served server, both legs plain (this machine's noise)")
    p.add_argument("--extra-serve-args", default="", help="appended to every server's command line")
    p.add_argument("--plot", metavar="FILE.png", help="draw per-prompt speedups and tok/s per run")
    p.add_argument("--traces", metavar="DIR", help="save each server's step traces (/v1/traces) as DIR/RUN.jsonl, "
                   "to read with `metrale replay`")
    return p


def _objectives(text: str) -> tuple[str, ...]:
    from runtime.plan import OBJECTIVES

    named = tuple(o.strip() for o in text.split(",") if o.strip())
    unknown = [o for o in named if o not in OBJECTIVES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown objective(s) {unknown}; choose from {list(OBJECTIVES)}")
    return named


def plan(args) -> list[tuple[str, list[str]]]:
    """(run name, server flags), in the order they run."""
    from runtime.bench._served import serve_accepts

    common = ["--scheduler-mode", args.scheduler_mode] if args.scheduler_mode else []
    tail = shlex.split(args.extra_serve_args)
    runs = [("served", common + tail)]
    runs += [(f"served:{o}", common + tail) for o in args.objectives if o != "balanced"]
    if not args.skip_foreign:
        if serve_accepts("--machine-id"):
            runs.append(("foreign", common + ["--machine-id", FOREIGN_MACHINE] + tail))
        else:
            print("note: `metrale serve --help` lists no --machine-id; the foreign run is skipped")
    for k in [int(k) for k in args.fixed_k.split(",") if k.strip()]:
        fixed = ["--mtp-gate", "force", "--spec-cost-model", "off", "--num-draft-tokens", str(k)]
        runs.append((f"K={k}", common + fixed + tail))
    return runs


def measure(model_dir, runs: list[tuple[str, list[str]]], sets: dict[str, list[str]], args) -> dict:
    """Every run's server at once; per set, for each run, a (speculative, plain) pair of batches per
    prompt group, the legs of one group sent back to back in a rotated order."""
    from runtime.bench._served import ServedProcess, openai_client, warm_up

    with ExitStack() as stack, ThreadPoolExecutor(args.clients) as pool:
        clients = {}
        for name, extra in runs:
            server = stack.enter_context(ServedProcess(model_dir, extra))
            print(f"{name}: {shlex.join(server.command('<fresh temp dir>'))}", flush=True)
            clients[name] = (server.url, openai_client(server.url))
            warm_up(clients[name][1], args.max_tokens, plain_too=True)
        summaries = dict(clients)
        if args.control:
            clients[CONTROL] = clients["served"]
        rounds = {s: drive(pool, clients, texts, args, offset=i * 7) for i, (s, texts) in enumerate(sets.items())}
        result = {name: {s: [(got[name, False], got[name, True]) for got in rounds[s]] for s in sets}
                  for name in clients}
        for name, (url, _) in summaries.items():
            print(f"{name}: {controller_summary(url)}", flush=True)
            if args.traces:
                save_traces(url, Path(args.traces) / f"{name.replace(':', '-').replace('=', '')}.jsonl")
        return result


def save_traces(url: str, path: Path) -> None:
    """The server's step traces (its decision ring) as JSONL."""
    import urllib.request

    path.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url + "/v1/traces", timeout=60) as r:
        path.write_bytes(r.read())


def controller_summary(url: str) -> str:
    """Where the controller's prior came from and what exploration cost, from the server's /health."""
    import json
    import urllib.request

    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        spec = json.load(r)["scheduler"]["speculation"]
    ctl = spec.get("controller")
    if not ctl:
        return f"controller: none (decider {spec.get('decider')})"
    costs, explore = ctl["cost_model"], ctl["exploration"]
    plain_ms = explore["earned_ms"] / explore["share"] if explore["share"] else 0.0
    share = explore["spent_ms"] / plain_ms if plain_ms else 0.0
    return (f"controller: prior {costs['prior_source']} (measured on {costs['prior_machine']!r}), "
            f"{costs['observations']} steps observed, scale to prior {costs['scale_to_prior']}; "
            f"exploration {explore['steps']} steps lost {explore['spent_ms']:.0f} ms = {share:.2%} of "
            f"{plain_ms / 1e3:.1f} s of plain decode; phases {ctl['phase_acceptance']}, request prior "
            f"strength {ctl.get('phase_request_strength', {})}")


def leg_order(runs: list[str], group: int, repeat: int) -> list[tuple[str, bool]]:
    """(run, disable_mtp) legs of one group's repeat: the runs in an order rotated per group, each
    run's two legs adjacent (their times seconds apart), plain first in every other group, and
    every other repeat the whole order reversed, so each leg goes first as often as second."""
    shift = group % len(runs)
    order = [(name, off) for name in runs[shift:] + runs[:shift]
             for off in ((True, False) if group % 2 == 0 else (False, True))]
    return order[::-1] if repeat % 2 else order


def drive(pool, clients: dict, texts: list[str], args, offset: int) -> list[dict]:
    """Per prompt group, every leg's batch, the fastest of its repeats: {(run, disable_mtp): Batch}."""
    from runtime.bench._served import ask_all, fastest

    rounds = []
    for i, start in enumerate(range(0, len(texts), args.clients)):
        group, tries = texts[start:start + args.clients], {}
        for repeat in range(args.repeats):
            for name, off in leg_order(list(clients), i + offset, repeat):
                # The control's "speculative" leg is a second plain one: two identical systems.
                plain = off or name == CONTROL
                tries.setdefault((name, off), []).append(
                    ask_all(pool, clients[name][1], group, args.max_tokens, disable_mtp=plain,
                            fields=request_fields(name)))
        rounds.append({leg: fastest(batches) for leg, batches in tries.items()})
    return rounds


def request_fields(run: str) -> dict:
    """The extra request fields of a run's requests: a `served:X` run asks for objective X. No request
    uses the prompt cache, so every repeat of a leg computes the same work."""
    fields = {"cache_prompt": False}
    return fields | {"objective": run.split(":", 1)[1]} if run.startswith("served:") else fields


@dataclass(frozen=True)
class RunStats:
    tokens: int
    tok_s_plain: float
    tok_s: float
    speedup: float
    worst: float
    spec_share: float
    acceptance: tuple[float, ...]
    same: int
    compared: int


def stats(pairs: list[tuple], window: int) -> RunStats:
    spec_s, plain_s = sum(s.seconds for s, _ in pairs), sum(p.seconds for _, p in pairs)
    spec_tokens, plain_tokens = sum(s.tokens for s, _ in pairs), sum(p.tokens for _, p in pairs)
    # Every repeat of either leg against the plain leg's fastest answer of the same prompt.
    answers = [(a, b) for s, p in pairs for a, b in zip(s.every_answer + p.others, cycle(p.answers))]
    receipts = [a.receipt for s, _ in pairs for a in s.every_answer]
    return RunStats(tokens=spec_tokens, tok_s_plain=plain_tokens / plain_s, tok_s=spec_tokens / spec_s,
                    speedup=plain_s / spec_s, worst=worst_window(pairs, window),
                    spec_share=spec_share(receipts), acceptance=acceptance(receipts),
                    same=sum(a.text == b.text for a, b in answers), compared=len(answers))


def worst_window(pairs: list[tuple], window: int) -> float:
    """The lowest plain/speculative seconds ratio over `window` consecutive groups."""
    w = max(1, min(window, len(pairs)))
    spans = [pairs[i:i + w] for i in range(len(pairs) - w + 1)]
    return min(sum(p.seconds for _, p in span) / sum(s.seconds for s, _ in span) for span in spans)


def spec_share(receipts: list[dict]) -> float:
    verify = sum(r.get("verify_steps", 0) for r in receipts)
    steps = verify + sum(r.get("plain_steps", 0) for r in receipts)
    return verify / steps if steps else float("nan")


def acceptance(receipts: list[dict]) -> tuple[float, ...]:
    """Accepted over drafted tokens at each draft position, summed over the receipts (nan: none drafted)."""
    drafted, accepted = [0] * POSITIONS, [0] * POSITIONS
    for r in receipts:
        for i, (d, a) in enumerate(zip(r.get("drafted_by_position", ()), r.get("accepted_by_position", ()))):
            if i < POSITIONS:
                drafted[i], accepted[i] = drafted[i] + d, accepted[i] + a
    return tuple(a / d if d else float("nan") for d, a in zip(drafted, accepted))


def report(results: dict[str, dict], sets: dict[str, list[str]], clients: int) -> str:
    """The tables, the best fixed K per set, and the last key=value line."""
    window = max(1, WINDOW // clients)
    lines, served, foreign, vs_fixed, identical, control = [], {}, {}, [], True, []
    for set_name in sets:
        by_run = {name: stats(runs[set_name], window) for name, runs in results.items()}
        lines += [f"set {set_name} ({len(sets[set_name])} prompts, {clients} client(s))", _table(by_run), ""]
        served[set_name] = by_run["served"].speedup
        if "foreign" in by_run:
            foreign[set_name] = by_run["foreign"].speedup
        if CONTROL in by_run:
            control.append(by_run[CONTROL].worst)
        identical &= all(r.same == r.compared for r in by_run.values())
        fixed = {n: r for n, r in by_run.items() if n.startswith("K=")}
        if fixed:
            best = max(fixed, key=lambda n: fixed[n].speedup)
            vs_fixed.append(by_run["served"].speedup / fixed[best].speedup)
            lines.append(f"{set_name}: best fixed {best} at {fixed[best].speedup:.3f}x its plain decode; served "
                         f"{by_run['served'].speedup:.3f}x = {vs_fixed[-1]:.3f}x best fixed")
    lines.append(summary(served, foreign, vs_fixed, identical, control))
    return "\n".join(lines)


def _table(by_run: dict[str, RunStats]) -> str:
    headers = ["run", "tokens", "tok_s_plain", "tok_s_served", "speedup", "worst5", "spec_steps"]
    headers += [f"acc{i + 1}" for i in range(POSITIONS)] + ["identical"]
    rows = [[name, r.tokens, r.tok_s_plain, r.tok_s, r.speedup, r.worst, r.spec_share, *r.acceptance,
             f"{r.same}/{r.compared}"] for name, r in by_run.items()]
    return table(headers, rows)


def summary(served: dict, foreign: dict, vs_fixed: list[float], identical: bool, control=()) -> str:
    def r(x: float) -> str:
        return "nan" if x is None or math.isnan(x) else f"{x:.3f}"

    keys = [f"served_speedup_{s}={r(served.get(s))}" for s in ("chat", "code")]
    keys.append(f"served_vs_best_fixed_min={r(min(vs_fixed) if vs_fixed else None)}")
    if foreign:
        keys += [f"foreign_speedup_{s}={r(foreign.get(s))}" for s in ("chat", "code")]
    if control:
        keys.append(f"control_worst5_min={r(min(control))}")
    return " ".join(keys + [f"identical={int(identical)}"])


def curves(results: dict[str, dict], sets) -> tuple[dict, dict]:
    """Plain data for plot(), per set and run: the speedup of each prompt group (plain seconds over
    speculative ones) and (speculative tok/s, plain tok/s), pooled."""
    def rate(batches) -> float:
        return sum(b.tokens for b in batches) / sum(b.seconds for b in batches)

    speedup = {s: {run: [p.seconds / x.seconds for x, p in by_set[s]] for run, by_set in results.items()}
               for s in sets}
    tok_s = {s: {run: (rate([x for x, _ in by_set[s]]), rate([p for _, p in by_set[s]]))
                 for run, by_set in results.items()} for s in sets}
    return speedup, tok_s


def plot(speedup: dict[str, dict[str, list[float]]], tok_s: dict[str, dict[str, tuple[float, float]]],
         last: str, path: str) -> None:
    """One row per set: each run's per-prompt speedup along the set (left) and its tok/s beside its
    own server's plain requests (right)."""
    fig, axes = _plot.figure("metrale bench serve", "bench serve: speculation against disable_mtp, as served",
                             rows=len(speedup), cols=2, size=(12, 3.8 * len(speedup) + 0.6))
    for (left, right), set_name in zip(axes, speedup):
        for run, values in speedup[set_name].items():
            fixed = run.startswith("K=")
            left.plot(range(1, len(values) + 1), values, marker="." if fixed else "o", linewidth=0.8 if fixed else 1.6,
                      linestyle=":" if fixed else "-", label=run)
        _plot.even(left, "plain")
        left.set(title=f"{set_name}: per-prompt speedup", xlabel="prompt (group) in set order",
                 ylabel="plain s / speculative s")
        left.legend(fontsize=8)
        runs = list(tok_s[set_name])
        at = range(len(runs))
        spec = right.bar([i - 0.2 for i in at], [tok_s[set_name][r][0] for r in runs], 0.4, label="speculative")
        plain = right.bar([i + 0.2 for i in at], [tok_s[set_name][r][1] for r in runs], 0.4, label="plain", alpha=0.5)
        for bars in (spec, plain):
            right.bar_label(bars, fmt="%.1f", fontsize=7)
        right.set_xticks(list(at), labels=runs)
        right.set(title=f"{set_name}: tok/s per run", xlabel="run", ylabel="tok/s")
        right.legend(fontsize=8)
    _plot.save(fig, path, last)
