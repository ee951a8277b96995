"""`metrale replay TRACE.jsonl`: print, step by step and in total, what the policies would have chosen
over a recorded trace and what that would have delivered, beside what was delivered
(runtime/replay.py); `--plot FILE.png` draws both.
"""

from __future__ import annotations

import argparse
import sys

from runtime.decisions import read_trace
from runtime.plan import OBJECTIVES
from runtime.replay import Choice, Replay, replay


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metrale replay", description=__doc__)
    p.add_argument("trace", help="a JSONL decision trace (GET /v1/traces, or serve --trace-file)")
    p.add_argument("--gate-margin", type=float, help="the gate's switch margin (default: the trace's)")
    p.add_argument("--window-steps", type=int, help="steps in one gate window (default: the trace's)")
    p.add_argument("--slack", type=float, help="the controller's tok/s slack (default: the trace's)")
    p.add_argument("--objective", choices=OBJECTIVES, help="every request's objective (default: each its own)")
    p.add_argument("--plot", metavar="FILE.png", help="draw tokens over time, recorded and replayed")
    p.add_argument("--quiet", action="store_true", help="totals only")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with open(args.trace, "rb") as f:
        header, steps = read_trace(f)
    result = replay(header, steps, margin=args.gate_margin, window_steps=args.window_steps, slack=args.slack,
                    objective=args.objective)
    if not args.quiet:
        print_steps(result)
    print(summary(result))
    if args.plot:
        plot(result, args.plot)
    return 0


def shown(c: Choice) -> str:
    if c.step == "plain":
        return "plain"
    return "mtp " + ",".join(map(str, c.depths)) + (" pin" if c.pinned else "") + (" explore" if c.exploring else "")


def print_steps(result: Replay, out=sys.stdout) -> None:
    print(f"{'step':>6} {'decider':<10} {'recorded':<18} {'replayed':<18} {'tok':>5} {'ms':>8} "
          f"{'tok*':>6} {'ms*':>8}", file=out)
    for r in result.steps:
        mark = "" if r.same else "  <- differs"
        print(f"{r.step:>6} {r.decider:<10} {shown(r.recorded):<18} {shown(r.replayed):<18} "
              f"{r.actual.tokens:>5g} {r.actual.wall_s * 1e3:>8.2f} {r.delivered.tokens:>6.3g} "
              f"{r.delivered.wall_s * 1e3:>8.2f}{mark}", file=out)
    print("(tok, ms: what the step delivered; tok*, ms*: what the replayed choice would have, by the trace's "
          "own measured costs)", file=out)


def summary(result: Replay) -> str:
    a, r = result.actual, result.replayed
    return (f"steps={a.steps} decisions_same={a.same} decisions_differ={a.steps - a.same} "
            f"recorded_tokens={a.tokens:.6g} recorded_s={a.wall_s:.6g} recorded_tok_s={a.tok_s:.4f} "
            f"recorded_tok_j={a.tok_j:.4f} replayed_tokens={r.tokens:.6g} replayed_s={r.wall_s:.6g} "
            f"replayed_tok_s={r.tok_s:.4f} replayed_tok_j={r.tok_j:.4f}")


def plot(result: Replay, path: str) -> None:
    from runtime.bench import _plot

    fig, axes = _plot.figure("metrale replay", "replay: what was delivered and what the replayed policies "
                             "would have", rows=2, size=(9, 6.5))
    top, bottom = axes[0][0], axes[1][0]
    for label, pick in (("recorded", lambda r: r.actual), ("replayed", lambda r: r.delivered)):
        t = tokens = 0.0
        xs, ys = [0.0], [0.0]
        for r in result.steps:
            d = pick(r)
            t, tokens = t + d.wall_s, tokens + d.tokens
            xs.append(t)
            ys.append(tokens)
        top.plot(xs, ys, label=f"{label} ({tokens / t if t else 0:.1f} tok/s)")
    top.set_xlabel("seconds of step time")
    top.set_ylabel("tokens")
    top.legend()
    steps = range(len(result.steps))
    bottom.step(steps, [max(r.recorded.depths, default=0) for r in result.steps], label="recorded depth")
    bottom.step(steps, [max(r.replayed.depths, default=0) for r in result.steps], label="replayed depth",
                linestyle="--")
    bottom.set_xlabel("step")
    bottom.set_ylabel("draft depth")
    bottom.yaxis.get_major_locator().set_params(integer=True)  # depths are whole tokens
    bottom.legend()
    _plot.save(fig, path, summary(result))
