"""metrale bench planner: the measured planner's depth against the best fixed depth, same run.

On the default model, greedy, on held-out prompts (calibration uses each set's first prompts; this
bench starts at --offset), at each --widths n (1 steps the serial engine; wider groups step one
batch, as mtp_batch does), every fixed K in 0..max_k and the planner decode the same prompts in
lockstep (kernels/planner_bench.py), so they share the machine's load step by step. The planner
runs as it serves: propose_depth on the calibrated table and prior (slack --slack, cap
--mtp-max-seqs) picks K, then sequence_depths picks how many of each sequence's drafts to verify.
The oracle is the fixed K with the best measured tokens per joule; the planner's K passes when its
tokens per joule is within 5% of the oracle's and its tok/s within the slack of the oracle's. The
planner as served (its K plus sequence_depths, which may verify fewer drafts) is run beside them
whenever it drafts, and reported.
Joules come from runtime/energy.py (the CPU-seconds proxy where no counter exists; printed).
Last line: worst_tpj_ratio_vs_oracle=R (planner / oracle, worst over prompt sets and widths).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from runtime.bench.common import table as format_table
from runtime.cost_table import CostTable, CostTableError, load_table, machine_id
from runtime.plan import DepthChoice, propose_depth, sequence_depths

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
    served_tpj_ratio: float | None = None  # the planner as served (K + sequence_depths), if run


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


def planner_rows(table: CostTable, depth: int, n: int):
    """What the scheduler asks after drafting: how many of each sequence's drafts to verify.
    The row budget here is n * depth: the bench caps rows by the proposed depth only."""
    prior = table.calibration.by_depth

    def rows(confidences: list[list[float]], counts: list[int]) -> tuple[int, ...]:
        return sequence_depths(table, confidences, prior=prior, max_k=depth, row_budget=n * depth,
                               known_drafts=counts)

    return rows


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
    from kernels.heads import build_drafter
    from kernels.loader import load
    from runtime.calibrate import model_id, resolve_drafter
    from runtime.energy import open_meter
    from runtime.text import TextCodec

    model_dir = ensure_default_model()
    drafter = resolve_drafter(args.drafter, model_dir, None)
    loaded, codec = load(model_dir), TextCodec(model_dir)
    engine_drafter = build_drafter(drafter, loaded.model, model_dir, None, None)[1]
    table = _table(args, model_dir, model_id(model_dir), drafter)
    meter = open_meter(table.meta.watts_per_core or 10.0)
    print(f"drafter: {drafter}; energy: {meter.source}; prior (acceptance by depth): "
          + " ".join(f"{p:.2f}" for p in table.calibration.by_depth))
    print(f"widths: {', '.join(map(str, widths))}; width 1 steps the serial engine, wider ones step one "
          f"batch as mtp_batch does (which speculates up to mtp_max_seqs={args.mtp_max_seqs})\n")
    worst = float("inf")
    for n in widths:
        choice = choose_depth(table, n=n, slack=args.slack, max_k=args.max_k, mtp_max_seqs=args.mtp_max_seqs)
        print(f"planner at width {n}: K={choice.depth} ({choice.reason})" + (
            f", expected {choice.tokens_per_ms * 1e3:.1f} tok/s, {choice.tokens_per_joule:.2f} tok/J"
            if choice.tokens_per_ms else ""))
        for set_name in ("code", "chat"):
            groups = _held_groups(codec, set_name, args.offset, max(1, args.prompts // n), n)
            totals, mismatches = sweep(loaded.model, groups, engine_drafter=engine_drafter, drafter=drafter,
                                       table=table, choice=choice, n=n, meter=meter, max_k=args.max_k,
                                       max_tokens=args.max_tokens, eos_ids=codec.eos_ids)
            verdict = compare(totals, choice.depth, args.slack)
            print(report(set_name, n, totals, verdict))
            if mismatches:
                print(f"note: {mismatches} sequence(s) decoded differently from plain decode at width {n}")
            print()
            worst = min(worst, verdict.tpj_ratio)
    print(f"worst_tpj_ratio_vs_oracle={worst:.3f}")
    return 0


def sweep(model, groups, *, engine_drafter, drafter, table, choice, n, meter, max_k, max_tokens, eos_ids):
    """Every fixed K and the planner on every prompt group in lockstep (kernels/planner_bench.py),
    their order rotated per group. Totals per configuration, and how many sequences' tokens
    differ from plain decode's (none at width 1, where greedy speculation is exact)."""
    from kernels.planner_bench import Config, lockstep

    keys: list[int | str] = list(range(max_k + 1))
    configs = [Config(str(k), k) for k in range(max_k + 1)]
    if choice.depth:  # as served, sequence_depths may verify fewer drafts than the fixed K does
        keys.append(PLANNER)
        configs.append(Config(PLANNER, choice.depth, planner_rows(table, choice.depth, n)))
    kw = dict(drafter=engine_drafter, drafter_kind=drafter, eos_ids=eos_ids, meter=meter)
    lockstep(model, groups[0], configs, max_tokens=8, **kw)  # warm-up: every shape once
    totals, mismatches = {k: Totals() for k in keys}, 0
    for turn, prompts in enumerate(groups):
        shift = turn % len(configs)
        runs = lockstep(model, prompts, configs[shift:] + configs[:shift], max_tokens=max_tokens, **kw)
        plain = runs["0"].tokens
        mismatches += sum(r.tokens[i] != plain[i] for r in runs.values() for i in range(len(plain)))
        for key, config in zip(keys, configs):
            m = runs[config.name]
            totals[key].add(m.decoded, m.seconds, m.joules, m.drafted, m.accepted)
    if n == 1 and mismatches:
        raise AssertionError(f"{mismatches} speculative run(s) changed greedy output at width 1")
    return totals, mismatches


def report(set_name: str, n: int, totals: dict[int | str, Totals], verdict: Verdict) -> str:
    oracle = totals[verdict.oracle_k]
    rows = []
    for config, t in totals.items():
        if config == PLANNER:
            name = f"planner as served (K={verdict.planner_k} + sequence_depths)"
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


def _held_groups(codec, set_name: str, offset: int, count: int, n: int) -> list[list[list[int]]]:
    """count groups of n held-out prompts (from offset on; cycling when the set runs short)."""
    from runtime.bench.spec import prompt_set
    from runtime.calibrate import chat_messages

    texts = prompt_set(set_name, 1000)
    held = texts[offset:] or texts
    ids = [codec.encode(codec.chat_text(chat_messages(held[i % len(held)]))) for i in range(count * n)]
    return [ids[g * n:(g + 1) * n] for g in range(count)]


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
