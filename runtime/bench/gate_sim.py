"""`metrale bench gate-sim`: the MTP gate on synthetic step-time traces, against both fixed modes.

Each trace gives, by the share of its work done, the batch width, the plain-step time, the verify-step cost (a
multiple of the plain step) and the per-draft acceptance probability. Step times get seeded
log-normal noise and rare stalls; a verify step emits, per sequence, 1 + the accepted prefix of K
drafts. The gate is driven exactly as the scheduler drives it (note_width, maybe_remeasure,
next_step, record, take_fresh_decision). Every policy does the same work with the same seed: each
sequence emits `--steps` tokens (the length of a plain-decode run), and phases follow the work done,
not the step count, so each policy meets each phase for the same tokens. Throughput is tokens over
summed step wall time.

Last line: `worst_ratio_vs_best_fixed=R`, the gate's tok/s over the better fixed mode's, worst trace.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass

from runtime.gate import GateStep, MtpGate

DRAFTS = 3  # K drafts per sequence per verify step
PROMPT_DEPTH = 512
NOISE_SIGMA = 0.08  # log-normal step-time noise
STALL_P, STALL_FACTOR = 0.005, 4.0  # a rare stall (GC, page faults) makes a step 4x slower


@dataclass(frozen=True)
class Phase:
    width: int
    plain_s: float  # one plain decode step over the whole batch
    verify_cost: float  # a verify step costs this many plain steps
    accept_p: float  # probability that each successive draft is accepted


@dataclass(frozen=True)
class Trace:
    name: str
    phase_at: Callable[[float], Phase]  # fraction of the run done -> phase


def _const(phase: Phase) -> Callable[[float], Phase]:
    return lambda _: phase


def _flip(first: Phase, second: Phase) -> Callable[[float], Phase]:
    return lambda f: first if f < 0.5 else second


def _alternate(a: Phase, b: Phase, periods: int) -> Callable[[float], Phase]:
    return lambda f: a if int(f * periods) % 2 == 0 else b


# Costs follow the measured verify tables (K=3 ~1.25x a plain step at width 1, more when wide).
WINS_1 = Phase(width=1, plain_s=0.058, verify_cost=1.25, accept_p=0.6)  # code edit: MTP ~1.6x
LOSES_1 = Phase(width=1, plain_s=0.058, verify_cost=1.25, accept_p=0.1)  # free chat: MTP ~0.9x
WINS_4 = Phase(width=4, plain_s=0.070, verify_cost=1.45, accept_p=0.6)
LOSES_8 = Phase(width=8, plain_s=0.085, verify_cost=1.9, accept_p=0.45)

TRACES = (
    Trace("mtp-faster", _const(WINS_1)),
    Trace("mtp-slower", _const(LOSES_1)),
    Trace("flip-mtp-to-serial", _flip(WINS_1, LOSES_1)),
    Trace("flip-serial-to-mtp", _flip(LOSES_1, WINS_1)),
    Trace("width4-mtp-faster", _const(WINS_4)),
    Trace("width8-mtp-slower", _const(LOSES_8)),
    Trace("width-1-8-alternating", _alternate(WINS_1, LOSES_8, periods=4)),
)


class Simulator:
    """One seeded run of a trace: the step it is asked to run -> (wall_s, tokens emitted)."""

    def __init__(self, trace: Trace, seq_tokens: int, seed: int):
        self.trace, self.budget = trace, seq_tokens
        self.rng = random.Random(seed)
        self.seq_tokens = 0.0  # per-sequence tokens so far: the work done, and the context growth

    @property
    def done(self) -> bool:
        return self.seq_tokens >= self.budget

    def phase(self) -> Phase:
        return self.trace.phase_at(self.seq_tokens / self.budget)

    def depth(self) -> int:
        return PROMPT_DEPTH + int(self.seq_tokens)

    def run(self, step: GateStep, phase: Phase) -> tuple[float, int]:
        # Attention grows with the context: +1.5% step time per 1k tokens.
        cost = phase.plain_s * (1 + 0.015 * self.depth() / 1024)
        if step is GateStep.MTP:
            cost *= phase.verify_cost
            tokens = sum(self._accepted(phase.accept_p) + 1 for _ in range(phase.width))
        else:
            tokens = phase.width
        cost *= self.rng.lognormvariate(0.0, NOISE_SIGMA)
        if self.rng.random() < STALL_P:
            cost *= STALL_FACTOR
        self.seq_tokens += tokens / phase.width
        return cost, tokens

    def _accepted(self, p: float) -> int:
        n = 0
        while n < DRAFTS and self.rng.random() < p:
            n += 1
        return n


@dataclass(frozen=True)
class Result:
    tok_s: float
    final_mode: str
    switches: int


def run_fixed(trace: Trace, steps: int, seed: int, step: GateStep) -> Result:
    sim = Simulator(trace, steps, seed)
    tokens, wall = 0, 0.0
    while not sim.done:
        dt, n = sim.run(step, sim.phase())
        tokens, wall = tokens + n, wall + dt
    return Result(tokens / wall, step.value, 0)


def run_gated(trace: Trace, steps: int, seed: int) -> Result:
    sim, gate = Simulator(trace, steps, seed), MtpGate()
    tokens, wall, switches = 0, 0.0, 0
    while not sim.done:
        phase = sim.phase()
        gate.note_width(phase.width)
        gate.maybe_remeasure(sim.depth())
        step = gate.next_step()
        dt, n = sim.run(step, phase)
        gate.record(step, wall_s=dt, width=phase.width, tokens_emitted=n)
        switches += gate.take_fresh_decision() is not None
        tokens, wall = tokens + n, wall + dt
    return Result(tokens / wall, gate.mode.value, switches)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="metrale bench gate-sim", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=6000, help="trace length: tokens per sequence (steps of plain decode)"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    print(f"{'trace':<24}{'final':>7}{'switches':>10}{'gate':>9}{'serial':>9}{'mtp':>9}{'ratio':>8}")
    worst = float("inf")
    for index, trace in enumerate(TRACES):
        seed = args.seed * 1000 + index
        gated = run_gated(trace, args.steps, seed)
        serial = run_fixed(trace, args.steps, seed, GateStep.PLAIN)
        mtp = run_fixed(trace, args.steps, seed, GateStep.MTP)
        ratio = gated.tok_s / max(serial.tok_s, mtp.tok_s)
        worst = min(worst, ratio)
        print(
            f"{trace.name:<24}{gated.final_mode:>7}{gated.switches:>10}{gated.tok_s:>9.1f}"
            f"{serial.tok_s:>9.1f}{mtp.tok_s:>9.1f}{ratio:>8.3f}"
        )
    print(f"worst_ratio_vs_best_fixed={worst:.3f}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
