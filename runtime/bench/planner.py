"""metrale bench planner: the measured planner's depth against the best fixed depth, same run.

On the default model at width 1, greedy, on held-out prompts (calibration uses each set's first
prompts; this bench starts at --offset), every fixed K in 0..max_k and the planner run back to
back per prompt, in an order rotated per prompt so machine drift hits all alike. The planner is
run as it serves: propose_depth on the calibrated table and prior (slack --slack, cap
--mtp-max-seqs) picks K, then sequence_depths picks how many of each step's drafts to verify.
The oracle is the fixed K with the best measured tokens per joule; the planner passes when its
tokens per joule is within 5% of the oracle's and its tok/s within the slack of the oracle's.
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
MTP_BATCH_NOTE = ("widths: 1 only. mtp_batch (batched speculation) does not exist yet "
                  "(scheduler modes available: serial), so there is no wider width to measure")


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
    tpj_ratio: float  # planner / oracle tokens per joule
    tps_ratio: float  # planner / oracle tok/s
    passed: bool


def compare(totals: dict[int | str, Totals], planner_k: int, slack: float) -> Verdict:
    """The oracle is the fixed K (int keys) with the best tokens per joule; ties keep the smaller K."""
    fixed = sorted(k for k in totals if isinstance(k, int))
    oracle = max(fixed, key=lambda k: (totals[k].tok_j, -k))
    planner, best = totals[PLANNER], totals[oracle]
    tpj, tps = planner.tok_j / best.tok_j, planner.tok_s / best.tok_s
    return Verdict(oracle, planner_k, tpj, tps, tpj >= 1 - TPJ_TOLERANCE and tps >= 1 - slack)


def choose_depth(table: CostTable, *, n: int, slack: float, max_k: int, mtp_max_seqs: int) -> DepthChoice:
    """What the scheduler asks before drafting: the prior is the table's acceptance by depth."""
    return propose_depth(n, table=table, prior=table.calibration.by_depth, max_k=max_k,
                         slack=slack, mtp_max_seqs=mtp_max_seqs)


def planner_rows(table: CostTable, depth: int):
    """What the scheduler asks after drafting (one sequence): how many drafts to verify."""
    prior = table.calibration.by_depth

    def rows(confidences: list[float], count: int) -> int:
        return sequence_depths(table, [confidences], prior=prior, max_k=depth, row_budget=depth,
                               known_drafts=[count])[0]

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
    p.add_argument("--prompts", type=int, default=3, help="held-out prompts per set")
    p.add_argument("--offset", type=int, default=10, help="first held-out prompt of each set")
    p.add_argument("--rounds", type=int, default=1, help="passes over the prompts")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("\nmetrale bench planner: interrupted", file=sys.stderr)
        return 130


def run(args) -> int:
    from kernels.default_model import ensure_default_model
    from kernels.engine import Engine
    from kernels.heads import build_drafter
    from kernels.loader import load
    from runtime.calibrate import resolve_drafter, model_id
    from runtime.energy import open_meter
    from runtime.text import TextCodec

    model_dir = ensure_default_model()
    drafter = resolve_drafter(args.drafter, model_dir, None)
    loaded, codec = load(model_dir), TextCodec(model_dir)
    engine = Engine(loaded.model, drafter=build_drafter(drafter, loaded.model, model_dir, None, None)[1])
    table = _table(args, model_dir, model_id(model_dir), drafter)
    meter = open_meter(table.meta.watts_per_core or 10.0)
    choice = choose_depth(table, n=1, slack=args.slack, max_k=args.max_k, mtp_max_seqs=args.mtp_max_seqs)
    print(f"energy: {meter.source}; prior (acceptance by depth): "
          + " ".join(f"{p:.2f}" for p in table.calibration.by_depth))
    print(f"planner at width 1: K={choice.depth} ({choice.reason}), expected "
          f"{choice.tokens_per_ms * 1e3:.1f} tok/s, {choice.tokens_per_joule:.2f} tok/J")
    print(MTP_BATCH_NOTE)
    print()
    worst = float("inf")
    for set_name in ("code", "chat"):
        prompts = _held_prompts(codec, set_name, args.offset, args.prompts)
        totals = sweep(engine, prompts, drafter=drafter, table=table, choice=choice, meter=meter,
                       max_k=args.max_k, max_tokens=args.max_tokens, rounds=args.rounds, eos_ids=codec.eos_ids)
        verdict = compare(totals, choice.depth, args.slack)
        print(report(set_name, totals, verdict))
        print()
        worst = min(worst, verdict.tpj_ratio)
    print(f"worst_tpj_ratio_vs_oracle={worst:.3f}")
    return 0


def sweep(engine, prompts, *, drafter, table, choice, meter, max_k, max_tokens, rounds, eos_ids):
    """Every fixed K and the planner on every prompt in lockstep (kernels/planner_bench.py), their
    order rotated per prompt; each must emit plain decode's tokens. Totals per configuration."""
    from kernels.planner_bench import Config, lockstep

    keys: list[int | str] = list(range(max_k + 1)) + [PLANNER]
    configs = [Config(str(k), k) for k in range(max_k + 1)]
    configs.append(Config(PLANNER, choice.depth, planner_rows(table, choice.depth) if choice.depth else None))
    lockstep(engine, prompts[0], configs, drafter=drafter, max_tokens=8, eos_ids=eos_ids, meter=meter)  # warm-up
    totals = {k: Totals() for k in keys}
    for turn, ids in enumerate(p for _ in range(rounds) for p in prompts):
        shift = turn % len(configs)
        runs = lockstep(engine, ids, configs[shift:] + configs[:shift], drafter=drafter,
                        max_tokens=max_tokens, eos_ids=eos_ids, meter=meter)
        if len({tuple(r.tokens) for r in runs.values()}) != 1:
            raise AssertionError(f"a configuration changed greedy output on prompt {turn}")
        for key, config in zip(keys, configs):
            m = runs[config.name]
            totals[key].add(m.decoded, m.seconds, m.joules, m.drafted, m.accepted)
    return totals


def report(set_name: str, totals: dict[int | str, Totals], verdict: Verdict) -> str:
    oracle = totals[verdict.oracle_k]
    rows = []
    for config, t in totals.items():
        k = verdict.planner_k if config == PLANNER else config
        name = f"planner (K={k})" if config == PLANNER else f"K={k}" + (" oracle" if k == verdict.oracle_k else "")
        acceptance = " ".join(f"{a / d:.2f}" for d, a in zip(t.drafted, t.accepted) if d) or "-"
        rows.append([set_name, 1, name, t.tokens, t.tok_s, t.tok_j, t.tok_j / oracle.tok_j,
                     t.tok_s / oracle.tok_s, acceptance])
    headers = ["set", "width", "config", "tokens", "tok_s", "tok_per_J", "tpj_vs_oracle",
               "tps_vs_oracle", "acceptance_by_position"]
    verdict_line = (f"{set_name} width 1: oracle K={verdict.oracle_k}, planner K={verdict.planner_k}: "
                    f"tpj_ratio={verdict.tpj_ratio:.3f} (>= {1 - TPJ_TOLERANCE:.2f}) "
                    f"tps_ratio={verdict.tps_ratio:.3f} -> {'PASS' if verdict.passed else 'FAIL'}")
    return format_table(headers, rows) + "\n" + verdict_line


def _held_prompts(codec, set_name: str, offset: int, count: int) -> list[list[int]]:
    from runtime.bench.spec import prompt_set
    from runtime.calibrate import chat_messages

    texts = prompt_set(set_name, offset + count)[offset:] or prompt_set(set_name, count)
    return [codec.encode(codec.chat_text(chat_messages(t))) for t in texts]


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
