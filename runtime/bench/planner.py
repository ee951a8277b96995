"""metrale bench planner: the measured planner's depth against the best fixed depth, same run.

On the default model, greedy, on held-out prompts (calibration uses each set's first prompts; this
bench starts at --offset), through the served actor system in this process
(runtime/bench/_inprocess.py): at each --widths n, n requests at once (1: serial mode; more: one
mtp_batch batch of n), every fixed K in 0..max_k (a System as `metrale serve --num-draft-tokens K
--mtp-gate force --spec-cost-model off`; K=0 is plain decode, disable_mtp) and the planner as
served (`--spec-cost-model measured` on the bench's table; requests ask for objective "energy")
decode the same prompt groups back to back, in an order rotated per group. Each configuration is
its own System (~0.7 GB each), all of a width running side by side. A run is measured from the
moment every request of the group has its first token (prefill is the same for every depth) to the
last one's end; each step pays a few queue hops and one owner hand-off (~0.1 ms of a ~60-90 ms
step). The planner's K is what propose_depth picks on the calibrated table and prior (slack
--slack, cap --mtp-max-seqs): where the served planner starts from. The oracle is the fixed K with the best
measured tokens per joule; the planner's K passes when its tokens per joule is within 5% of the
oracle's and its tok/s within the slack of the oracle's. The planner as served (its depth per step
and how many of each sequence's drafts it verifies) is run beside them and reported.
Joules come from runtime/energy.py (the CPU-seconds proxy where no counter exists; printed).
Last line: worst_tpj_ratio_vs_oracle=R (the planner's K / oracle, worst over prompt sets and
widths) worst_served_tpj_ratio_vs_oracle=R (the planner as served / oracle, likewise).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from runtime.bench.common import table as format_table
from runtime.cost_table import CostTable, CostTableError, load_table, machine_id
from runtime.plan import DepthChoice, propose_depth

TPJ_TOLERANCE = 0.05  # the planner's tokens per joule may trail the oracle's by this much
PLANNER = "planner"


@dataclass
class Totals:
    tokens: int = 0
    seconds: float = 0.0
    joules: float = 0.0
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def add(self, tokens: int, seconds: float, joules: float, drafted, accepted) -> None:
        self.tokens, self.seconds, self.joules = self.tokens + tokens, self.seconds + seconds, self.joules + joules
        self.drafted = [a + b for a, b in _zip_pad(self.drafted, drafted)]
        self.accepted = [a + b for a, b in _zip_pad(self.accepted, accepted)]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tok_j(self) -> float:
        return self.tokens / self.joules if self.joules else 0.0


def _zip_pad(a: list[int], b: list[int]):
    n = max(len(a), len(b))
    return zip(a + [0] * (n - len(a)), list(b) + [0] * (n - len(b)))


@dataclass(frozen=True)
class Verdict:
    oracle_k: int
    planner_k: int
    tpj_ratio: float  # tokens per joule at the planner's K / at the oracle's
    tps_ratio: float  # tok/s likewise
    slack: float
    passed: bool
    served_tpj_ratio: float | None = None  # the planner as served, where it was run


def compare(totals: dict[int | str, Totals], planner_k: int, slack: float) -> Verdict:
    """The planner's K against the oracle: the fixed K (int keys) with the best tokens per joule
    (ties keep the smaller K). Both come from the same sweep, so a planner that picks the oracle's
    K scores exactly 1 (not one noisy run of the same steps against another); the planner as
    served (totals[PLANNER], when run) is reported beside it."""
    fixed = sorted(k for k in totals if isinstance(k, int))
    oracle = max(fixed, key=lambda k: (totals[k].tok_j, -k))
    planner, best = totals[planner_k], totals[oracle]
    tpj, tps = planner.tok_j / best.tok_j, planner.tok_s / best.tok_s
    served = totals[PLANNER].tok_j / best.tok_j if PLANNER in totals else None
    passed = tpj >= 1 - TPJ_TOLERANCE and tps >= 1 - slack
    return Verdict(oracle, planner_k, tpj, tps, slack, passed, served)


def choose_depth(table: CostTable, *, n: int, slack: float, max_k: int, mtp_max_seqs: int) -> DepthChoice:
    """What the scheduler asks before drafting: the prior is the table's acceptance by depth."""
    return propose_depth(n, table=table, prior=table.calibration.by_depth, max_k=max_k,
                         slack=slack, mtp_max_seqs=mtp_max_seqs)


# --- the command -------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="metrale bench planner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", help="a calibration table (default: the cache's, else configs/calibration/)")
    p.add_argument("--drafter", choices=["auto", "ngram", "mtp"], default="auto")
    p.add_argument("--slack", type=float, default=0.1, help="tok/s the planner may give up vs depth 1")
    p.add_argument("--mtp-max-seqs", type=int, default=32)
    p.add_argument("--max-k", type=int, default=8)
    p.add_argument("--widths", default="1,2", help="batch widths; above 1 they step as mtp_batch does")
    p.add_argument("--prompts", type=int, default=4,
                   help="held-out prompts per set; at width n they decode as prompts // n batches")
    p.add_argument("--offset", type=int, default=10, help="first held-out prompt of each set")
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args(argv)
    try:
        return run(args, [int(w) for w in args.widths.split(",")])
    except KeyboardInterrupt:
        print("\nmetrale bench planner: interrupted", file=sys.stderr)
        return 130


def run(args, widths: list[int]) -> int:
    from kernels.default_model import ensure_default_model
    from runtime.calibrate import model_id, resolve_drafter
    from runtime.energy import open_meter

    model_dir = ensure_default_model()
    drafter = resolve_drafter(args.drafter, model_dir, None)
    table = _table(args, model_dir, model_id(model_dir), drafter)  # before the event loop: it may calibrate
    meter = open_meter(table.meta.watts_per_core or 10.0)
    print(f"drafter: {drafter}; energy: {meter.source}; prior (acceptance by depth): "
          + " ".join(f"{p:.2f}" for p in table.calibration.by_depth))
    print(f"widths: {', '.join(map(str, widths))}; width 1 serves in serial mode, wider ones in mtp_batch "
          f"(which speculates up to mtp_max_seqs={args.mtp_max_seqs})\n")
    bench = Bench(model_dir, drafter, table, meter, args.max_k, args.slack, args.mtp_max_seqs, args.max_tokens)
    worst = asyncio.run(_widths(bench, widths, args))
    print(f"worst_tpj_ratio_vs_oracle={worst[0]:.3f} worst_served_tpj_ratio_vs_oracle={worst[1]:.3f}")
    return 0


async def _widths(bench: "Bench", widths: list[int], args) -> tuple[float, float]:
    worst = [float("inf"), float("inf")]
    for n in widths:
        choice = choose_depth(bench.table, n=n, slack=bench.slack, max_k=bench.max_k, mtp_max_seqs=bench.mtp_max_seqs)
        print(f"planner at width {n}: K={choice.depth} ({choice.reason})" + (
            f", expected {choice.tokens_per_ms * 1e3:.1f} tok/s, {choice.tokens_per_joule:.2f} tok/J"
            if choice.tokens_per_ms else ""))
        groups = {name: held_groups(name, args.offset, max(1, args.prompts // n), n) for name in ("code", "chat")}
        for set_name, (totals, mismatches) in (await bench.sweep(groups, n)).items():
            verdict = compare(totals, choice.depth, bench.slack)
            print(report(set_name, n, totals, verdict))
            if mismatches:
                print(f"note: {mismatches} sequence(s) decoded differently from plain decode at width {n}")
            print()
            worst = [min(worst[0], verdict.tpj_ratio), min(worst[1], verdict.served_tpj_ratio)]
    return worst[0], worst[1]


@dataclass(frozen=True)
class Bench:
    """What every width's sweep shares."""

    model_dir: Path
    drafter: str
    table: CostTable
    meter: object
    max_k: int
    slack: float
    mtp_max_seqs: int
    max_tokens: int

    def configs(self, n: int, table_dir: Path) -> dict[int | str, object]:
        """Fixed K = 1..max_k (K = 0 runs on K = 1's system with disable_mtp) and the planner as
        served, which finds the bench's table in table_dir as it would a calibrated one."""
        from runtime.bench._inprocess import at_width, fixed_depth
        from runtime.config import load_config, override

        base = override(at_width(load_config(), n), "scheduler", mtp_max_seqs=self.mtp_max_seqs)
        configs: dict[int | str, object] = {k: fixed_depth(base, self.drafter, k) for k in range(1, self.max_k + 1)}
        planner = override(base, "spec", drafter=self.drafter, cost_model="measured", num_draft_tokens=self.max_k,
                           cost_slack=self.slack)
        configs[PLANNER] = override(planner, "model", cache_dir=str(table_dir))
        return configs

    async def sweep(self, groups: dict[str, list], n: int) -> dict[str, tuple[dict, int]]:
        """Per prompt set: totals per configuration and how many sequences' tokens differ from
        plain decode's (none at width 1, where greedy speculation is exact)."""
        import tempfile

        from runtime.bench._inprocess import served_all
        from runtime.calibrate import model_id, table_name
        from runtime.cost_table import save_table

        with tempfile.TemporaryDirectory(prefix="metrale-bench-planner-") as tmp:
            save_table(self.table, Path(tmp) / "calibration" / table_name(model_id(self.model_dir), self.drafter))
            async with served_all(self.configs(n, Path(tmp)), self.model_dir) as clients:
                clients = {0: clients[1], **clients}
                first = next(iter(groups.values()))[0]
                await self.run_groups(clients, [first], 8)  # untimed: every system builds its paths once
                swept = {name: await self.run_groups(clients, prompts, self.max_tokens)
                         for name, prompts in groups.items()}
        if n == 1 and any(mismatches for _, mismatches in swept.values()):
            raise AssertionError("a speculative run changed greedy output at width 1")
        return swept

    async def run_groups(self, clients: dict, groups: list, max_tokens: int) -> tuple[dict, int]:
        """Every configuration on every group, in an order rotated per group."""
        from runtime.bench._inprocess import plain
        from runtime.messages import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, objective="energy")
        keys = list(clients)
        totals, mismatches = {k: Totals() for k in keys}, 0
        mark = lambda: (time.perf_counter(), self.meter.read())  # noqa: E731
        for turn, prompts in enumerate(groups):
            shift = turn % len(keys)
            runs = {k: await clients[k].group(prompts, plain(params) if k == 0 else params, mark)
                    for k in keys[shift:] + keys[:shift]}
            reference = [r.tokens for r in runs[0].results]
            mismatches += sum(r.tokens != t for g in runs.values() for r, t in zip(g.results, reference))
            for key, group in runs.items():
                add_group(totals[key], group)
        return totals, mismatches


def add_group(totals: Totals, group) -> None:
    """A group's tokens after each request's first, its seconds and joules from the moment all had
    their first token to the last one's end, and its drafts by position (from the receipts)."""
    (_, _), (t0, e0), (t1, e1) = group.marks
    totals.add(sum(max(0, len(r.tokens) - 1) for r in group.results), t1 - t0, e1.since(e0), [], [])
    for r in group.results:
        totals.add(0, 0.0, 0.0, r.receipt.drafted_by_position, r.receipt.accepted_by_position)


def report(set_name: str, n: int, totals: dict[int | str, Totals], verdict: Verdict) -> str:
    oracle = totals[verdict.oracle_k]
    rows = []
    for config, t in totals.items():
        if config == PLANNER:
            name = "planner as served"
        else:
            roles = [r for r, k in (("planner", verdict.planner_k), ("oracle", verdict.oracle_k)) if k == config]
            name = f"K={config}" + "".join(f" {r}" for r in roles)
        acceptance = " ".join(f"{a / d:.2f}" for d, a in zip(t.drafted, t.accepted) if d) or "-"
        rows.append([set_name, n, name, t.tokens, t.tok_s, t.tok_j, t.tok_j / oracle.tok_j,
                     t.tok_s / oracle.tok_s, acceptance])
    headers = ["set", "width", "config", "tokens", "tok_s", "tok_per_J", "tpj_vs_oracle",
               "tps_vs_oracle", "acceptance_by_position"]
    served = "" if verdict.served_tpj_ratio is None else f" (as served: {verdict.served_tpj_ratio:.3f})"
    verdict_line = (f"{set_name} width {n}: oracle K={verdict.oracle_k}, planner K={verdict.planner_k}: "
                    f"tpj_ratio={verdict.tpj_ratio:.3f}{served} (>= {1 - TPJ_TOLERANCE:.2f}) "
                    f"tps_ratio={verdict.tps_ratio:.3f} (>= {1 - verdict.slack:.2f}) "
                    f"-> {'PASS' if verdict.passed else 'FAIL'}")
    return format_table(headers, rows) + "\n" + verdict_line


def held_groups(set_name: str, offset: int, count: int, n: int) -> list[list[str]]:
    """count groups of n held-out prompts (from offset on; cycling when the set runs short)."""
    from runtime.bench.spec import prompt_set

    texts = prompt_set(set_name, 1000)
    held = texts[offset:] or texts
    chosen = [held[i % len(held)] for i in range(count * n)]
    return [chosen[g * n:(g + 1) * n] for g in range(count)]


def _table(args, model_dir, name: str, drafter: str) -> CostTable:
    """--table, else the cache's or the shipped table for this model and machine, else a quick one."""
    from runtime.calibrate import find_table, quick_table

    path = args.table or find_table(name, drafter)
    if path is not None:
        try:
            table = load_table(path, expect_model=name, expect_machine=machine_id())
            print(f"table: {path}")
            return table
        except CostTableError as exc:
            if args.table:
                raise
            print(f"table: {path} is not usable here ({exc})")
    table, saved = quick_table(model_dir, name, drafter, args.max_k)
    print(f"table: none for this model and machine; calibrated a quick one (width 1) -> {saved}")
    return table
