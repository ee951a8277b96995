"""metrale bench distributed: the same requests served by one process and by a group of processes
under `mlx.launch --backend ring` on loopback, in one run.

Both servers get the same settings, a warm-up and then the held-out chat and code prompts, one at a
time, greedy, through the official openai client. Per server: tok/s (completion tokens over the
requests' wall time), the served step time (the scheduler's step wall time, from /metrics), and for
the group its split: communication is the commands' broadcasts (their count per step, served, times
one broadcast's cost) plus each step's forward collectives, both timed alone at start-up (the
fastest of 20; a forward's at 1 row for plain steps, 4 for speculative ones); compute is the rest of
the step, waits for the other ranks' compute included. The outputs must be byte-identical.

On one host the ranks share the cores, so the group is expected to be slower: the point is the
measured cost of communication per step, which the README turns into an estimate for real machines.
Last line: identical=1 tok_s_ratio=R comm_share=S (group tok/s over single; communication over step).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import urllib.request
from dataclasses import dataclass

from runtime.bench._group import LaunchedGroup
from runtime.bench._served import ServedProcess, ask, openai_client, warm_up
from runtime.bench.common import table
from runtime.bench.spec import prompt_set


@dataclass
class Run:
    name: str
    texts: list[str]
    tokens: int
    seconds: float
    steps: dict[str, tuple[int, float]]  # phase -> (count, seconds), from /metrics
    group: dict | None = None  # /health's distributed block
    owner_ms: dict | None = None  # /health's owner_ms: what each command kind costs on the owner thread
    costs: dict | None = None  # the online cost model's account (prior, observations, scale to prior)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def step_count(self) -> int:
        return sum(n for n, _ in self.steps.values())

    @property
    def step_ms(self) -> float:
        return 1e3 * sum(s for _, s in self.steps.values()) / max(self.step_count, 1)

    @property
    def comm_ms(self) -> float:
        """Per step: the commands' broadcasts and each step's forward collectives, at what they cost
        alone (a broadcast that waits for a rank still computing waits for compute)."""
        if self.group is None:
            return 0.0
        g = self.group
        per_step = g["commands"] / max(self.step_count, 1) * g["collectives_ms"]["command"]
        forwards = {"step_plain": g["collectives_ms"]["1"], "step_mtp": g["collectives_ms"]["4"]}
        collectives = sum(n * forwards.get(phase, forwards["step_plain"]) for phase, (n, _) in self.steps.items())
        return per_step + collectives / max(self.step_count, 1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench distributed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="of each held-out set (chat, code)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=2, help="processes of the group")
    parser.add_argument("--parallel", choices=["auto", "tensor", "pipeline"], default="auto")
    parser.add_argument("--serve-args", default="", help="extra `metrale serve` flags for both servers")
    args = parser.parse_args(argv)
    from kernels.default_model import ensure_default_model

    model_dir = ensure_default_model()
    prompts = prompt_set("chat", args.prompts) + prompt_set("code", args.prompts)
    extra = shlex.split(args.serve_args)
    with ServedProcess(model_dir, extra) as single:
        alone = measure("single", single.url, prompts, args.max_tokens)
        found = health(single.url)
        alone.owner_ms, alone.costs = found["owner_ms"], cost_model(found)
    group_extra = [*extra, "--parallel", args.parallel]
    with LaunchedGroup(model_dir, group_extra, ranks=args.ranks) as launched:
        group = measure(f"{args.ranks} ranks", launched.url, prompts, args.max_tokens)
        found = launched.health()
        group.group, group.owner_ms = found["distributed"], found["owner_ms"]
        group.costs = cost_model(found)
    report(alone, group, args.ranks)
    return 0


def measure(name: str, url: str, prompts: list[str], max_tokens: int) -> Run:
    client = openai_client(url)
    warm_up(client, 8, plain_too=False)
    before = phase_seconds(url)
    answers = [ask(client, p, max_tokens, disable_mtp=False) for p in prompts]
    after = phase_seconds(url)
    steps = {k: (after[k][0] - before.get(k, (0, 0.0))[0], after[k][1] - before.get(k, (0, 0.0))[1]) for k in after}
    return Run(name, [a.text for a in answers], sum(a.tokens for a in answers), sum(a.seconds for a in answers),
               {k: v for k, v in steps.items() if v[0] > 0})


def cost_model(found: dict) -> dict | None:
    controller = ((found.get("scheduler") or {}).get("speculation") or {}).get("controller")
    return controller["cost_model"] if controller else None


def health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.loads(r.read())


def phase_seconds(url: str) -> dict[str, tuple[int, float]]:
    """The scheduler's step histogram from /metrics: phase -> (count, seconds)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    found: dict[str, list] = {}
    for kind, phase, value in re.findall(r'^metrale_sched_phase_seconds_(count|sum)\{phase="([^"]+)"\} (\S+)$',
                                         text, re.M):
        entry = found.setdefault(phase, [0, 0.0])
        entry[0 if kind == "count" else 1] = int(float(value)) if kind == "count" else float(value)
    return {k: (n, s) for k, (n, s) in found.items()}


def report(alone: Run, group: Run, ranks: int) -> None:
    rows = []
    for run in (alone, group):
        comm = run.comm_ms
        rows.append([run.name, run.tokens, run.tok_s, run.step_count, run.step_ms, run.step_ms - comm, comm,
                     comm / run.step_ms if run.step_ms else 0.0])
    print(table(["server", "tokens", "tok_s", "steps", "step_ms", "compute_ms", "comm_ms", "comm_share"], rows))
    g = group.group
    c = g["collectives_ms"]
    print(f"group: {g['parallel']} over {ranks} processes; alone, a command's broadcast {c['command']:.3f} ms, "
          f"one forward's collectives {c['1']:.3f} ms (1 row), {c['4']:.3f} ms (4 rows); served, "
          f"{g['commands']} commands ({g['commands'] / max(group.step_count, 1):.2f} per step) took "
          f"{g['command_ms']:.3f} ms each, waits for the other ranks' compute included")
    for run in (alone, group):
        kinds = ", ".join(f"{k} {v['mean_ms']:.2f} ms x{v['count']}" for k, v in sorted(run.owner_ms.items()))
        print(f"{run.name}: owner commands (broadcast apart): {kinds}")
    for run in (alone, group):
        if run.costs is not None:  # the distributed step priced as measured, not as the prior said
            print(f"{run.name}: cost model prior {run.costs['prior_source']} ({run.costs['prior_machine']}), "
                  f"{run.costs['observations']} steps learned, measured/prior {run.costs['scale_to_prior']}")
    identical = int(alone.texts == group.texts)
    for i, (a, b) in enumerate(zip(alone.texts, group.texts)):
        if a != b:
            print(f"prompt {i}: outputs differ\n  single: {a[:200]!r}\n  group:  {b[:200]!r}")
    comm_share = group.comm_ms / group.step_ms if group.step_ms else 0.0
    print(f"identical={identical} tok_s_ratio={group.tok_s / alone.tok_s:.3f} comm_share={comm_share:.3f}")
