"""metrale bench batch: aggregate tok/s and inter-token latency at 1..32 concurrent clients.

Side by side in one run, on the default model with the same prompts: mlx-lm's own BatchGenerator (no
speculation, in this process), metrale mtp_batch with speculation off (disable_mtp per request) and
with speculation on (gate and planner on), both through `metrale serve` in its own process on
loopback, as users run it, with one streaming client per request. (Served from the bench's own
process, the server shared its event loop and the GIL with the clients, and requests allowed to
speculate read 0.874-0.884 of disable_mtp ones at four clients with no step speculating; a server of
its own read 1.058, A/A 0.997, on a 2-core AMD EPYC.) The server keeps its learned cost tables in a
fresh temporary folder, so it starts from the shipped table as on a new machine and learns as it
serves (its start-up check of that table, seconds in its idle moments, is let finish before the
timed rounds, as on a quiet machine). A round at w clients sends ceil(8 / w) waves of w concurrent
requests, each wave the next prompts in turn (one client: eight requests, one after another).
Requests carry `"cache_prompt": false`: the rounds repeat the prompts, and the prompt cache (which
mlx-lm's generator does not have) would time which system ran after which. Each width runs --rounds
rounds, the systems back to back in an order from a Williams square (over a few rounds each system
runs after each other one equally often). A system's tok/s and latency pool its rounds; a ratio is
the median over rounds of the ratio within each round (paired: a slow spell of this shared machine
hits the runs of one round alike, and one bad round cannot move a median). `spec_steps` is the share
of the "on" server's batch steps that speculated. With --control, speculation off runs a second time
per round (`mtp_batch_off_again`): its ratio to the first is that of two identical systems, the
machine's own noise, to read the other ratios against. `range` is the smallest and largest ratio
over the rounds: if the true median ratio were 1.0 or more and rounds were independent, all R rounds
would fall below 1.0 with probability at most 2^-R (3% at 5 rounds), so a width whose whole range is
below 1.0 is counted as a measured loss (with --control, the A/A row shows how far this machine's
rounds are from independent). Last line: min_ratio_off_vs_batchgen=R min_ratio_on_vs_off=R (the
smallest median ratio over the widths) widths_lost_off_vs_batchgen=N widths_lost_on_vs_off=N. --plot
FILE.png draws tok/s and the ratios against clients; --traces FILE.jsonl saves the server's step
decisions (/v1/traces) at the end, both systems' steps, for reading what it chose.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from runtime.bench import _plot
from runtime.bench.common import table

PROMPTS = ["Write a short story about a robot learning to paint.", "Explain how a bicycle works.",
           "List some tips for learning a new language.", "Write a Python function that sorts a list.",
           "Describe the water cycle.", "What makes a good cup of coffee?",
           "Write a poem about the ocean.", "How do airplanes stay in the air?"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench batch", description=__doc__)
    parser.add_argument("--widths", default="1,4,8,16,32")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per width, ordered by a Williams square")
    parser.add_argument("--port", type=int, default=0, help="0: a free loopback port")
    parser.add_argument("--prompts", choices=("mixed", "chat", "code"), default="mixed",
                        help="mixed: eight everyday and programming prompts; chat, code: the held-out sets")
    parser.add_argument("--control", action="store_true", help="run speculation off twice per round (A/A)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw tok/s and ratios against clients")
    parser.add_argument("--traces", metavar="FILE.jsonl", help="save the server's step traces (/v1/traces) at the end")
    args = parser.parse_args(argv)
    if args.plot:
        _plot.pyplot(parser.prog)  # fail before measuring, not after
    widths = [int(w) for w in args.widths.split(",")]
    systems = SYSTEMS + (CONTROL,) if args.control else SYSTEMS
    return asyncio.run(run(widths, args.max_tokens, args.rounds, args.port, prompt_texts(args.prompts), systems,
                           args.plot, args.traces))


def prompt_texts(name: str) -> list[str]:
    """The prompts clients cycle through (client i asks prompt i mod len)."""
    from runtime.bench.spec import prompt_set

    return PROMPTS if name == "mixed" else prompt_set(name, 32)


SYSTEMS = ("batchgen", "mtp_batch_off", "mtp_batch_on")
CONTROL = "mtp_batch_off_again"


async def run(widths: list[int], max_tokens: int, rounds: int, port: int, texts: list[str] = PROMPTS,
              systems: tuple[str, ...] = SYSTEMS, plot_path: str | None = None,
              traces_path: str | None = None) -> int:
    from kernels.default_model import ensure_default_model
    from runtime.bench._served import ServedProcess
    from runtime.config import preset

    model_dir = ensure_default_model()
    widest = max(widths)
    flags = ["--config", str(preset("mtp_batch")), "--max-active-requests", str(widest),
             "--max-pending", str(max(64, 2 * widest)), "--log-format", "json"]
    # A fresh cache folder: no learned table, the server starts from the shipped one as on a new machine
    with ServedProcess(model_dir, flags, port=port) as server:
        async with _mlx_worker() as worker:
            code = await _measure(server, model_dir, worker, widths, max_tokens, rounds, texts, systems, plot_path)
        if traces_path:
            from pathlib import Path

            from runtime.bench.serve import save_traces

            await asyncio.to_thread(save_traces, server.url, Path(traces_path))
        return code


@contextlib.asynccontextmanager
async def _mlx_worker():
    """One thread for mlx-lm's generator, gone at the OS level before the command ends: its exit frees
    the MLX compile cache it built, which takes the GIL; a default-executor thread still exiting while
    the interpreter finalizes aborted the process ("terminate called without an active exception")."""
    from actors.model_owner import thread_gone

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchgen")
    try:
        yield pool
    finally:
        native_id = await asyncio.get_running_loop().run_in_executor(pool, threading.get_native_id)
        pool.shutdown(wait=True)
        await thread_gone(native_id)


async def _measure(server, model_dir, worker, widths, max_tokens, rounds, texts, systems, plot_path) -> int:
    from kernels.bare import BatchGeneratorRunner
    from runtime.bench._served import wait_checked
    from runtime.bench.serving import pooled
    from runtime.text import TextCodec

    codec = TextCodec(model_dir)
    batchgen = BatchGeneratorRunner(model_dir, codec.eos_ids)
    rows, points, off_ratios, on_ratios = [], [], [], []  # per width: the ratio of each round
    warm = [codec.encode(codec.chat_text(_chat(texts[0])))]
    for name in systems:  # untimed: first runs page weights in and build every code path once
        await _one_run(name, server, worker, batchgen, texts[:1], warm, 4, Counter())
    # The server's check of its cost prior runs in its idle moments: left to run while the in-process
    # generator was timed, it timed its cells beside that and slowed the generator's first rounds.
    await asyncio.to_thread(wait_checked, server.url)
    for width in widths:
        waves = [(prompts, [codec.encode(codec.chat_text(_chat(p))) for p in prompts])
                 for prompts in waves_of(texts, width)]
        runs = {name: [] for name in systems}
        spec_steps = Counter()
        for r in range(rounds):
            for name in round_order(systems, r):
                runs[name].append(pooled([await _one_run(name, server, worker, batchgen, prompts, ids, max_tokens,
                                                         spec_steps) for prompts, ids in waves]))
        off = round_ratios(runs["mtp_batch_off"], runs["batchgen"])
        on = round_ratios(runs["mtp_batch_on"], runs["mtp_batch_off"])
        share = spec_steps["mtp"] / max(1, sum(spec_steps.values()))
        lines = [("batchgen", None, ""), ("mtp_batch_off", off, ""), ("mtp_batch_on", on, f"{share:.2f}")]
        if CONTROL in runs:
            lines.append((CONTROL, round_ratios(runs[CONTROL], runs["mtp_batch_off"]), ""))
        for name, ratios, spec in lines:
            r = pooled(runs[name])
            ratio, spread = (f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}..{max(ratios):.3f}") \
                if ratios else ("", "")
            rows.append([width, name, r.tokens, r.tok_s, r.itl_p50 * 1000, r.itl_p99 * 1000, ratio, spread, spec])
            points.append((width, name, r.tok_s, ratios))
        off_ratios.append(off)
        on_ratios.append(on)
    print(table(["clients", "system", "tokens", "agg_tok_s", "itl_p50_ms", "itl_p99_ms", "ratio", "range",
                 "spec_steps"], rows))
    print("ratio: off vs batchgen, on vs off, off again vs off (median over rounds of the ratio within a round); "
          "range: over rounds")
    last = summary(off_ratios, on_ratios)
    print(last)
    if plot_path:
        plot(points, last, plot_path)
    return 0


ROUND_REQUESTS = 8  # the fewest requests a round of one system sends: at one client, one prompt alone is noise


def waves_of(texts: list[str], width: int) -> list[list[str]]:
    """A round's waves of `width` concurrent requests, enough for ROUND_REQUESTS, each wave taking the
    next prompts in turn: a round at one client is eight requests over eight prompts. With one
    request of the same prompt a round (48 tokens, ~1.3 s), two identical systems read 0.925 at the
    median of five rounds on a 2-core AMD EPYC, and the ratio was one story prompt's."""
    count = -(-ROUND_REQUESTS // width)
    return [[texts[(wave * width + i) % len(texts)] for i in range(width)] for wave in range(count)]


def round_order(systems: tuple[str, ...], r: int) -> tuple[str, ...]:
    """Round r's order, a row of a Williams square (each row a shift of 0, 1, n-1, 2, n-2, ...; for an
    odd n also each row reversed): over n rounds (2n if n is odd) each system runs right after each
    other one equally often. A plain rotation kept every system behind the same one, so whatever one
    left behind (after the in-process generator, or after speculation) always fell on the next."""
    n = len(systems)
    base = [0]
    for i in range(1, n):
        base.append((i + 1) // 2 if i % 2 else n - i // 2)
    period = n if n % 2 == 0 else 2 * n
    row = [(b + r % n) % n for b in base]
    if r % period >= n:
        row.reverse()
    return tuple(systems[i] for i in row)


def summary(off_ratios: list[list[float]], on_ratios: list[list[float]]) -> str:
    """The last line: the smallest median ratio over the widths, and the widths measured as a loss
    (every round below 1.0)."""
    pairs = (("off_vs_batchgen", off_ratios), ("on_vs_off", on_ratios))
    lowest = [f"min_ratio_{key}={min(statistics.median(r) for r in ratios):.3f}" for key, ratios in pairs]
    lost = [f"widths_lost_{key}={sum(max(r) < 1.0 for r in ratios)}" for key, ratios in pairs]
    return " ".join(lowest + lost)


RATIO_LABELS = {"mtp_batch_off": "off / batchgen", "mtp_batch_on": "on / off", CONTROL: "off again / off (A/A)"}


def plot(points: list[tuple], last: str, path: str) -> None:
    """points: (clients, system, pooled tok/s, per-round ratios or None). Top: tok/s per system;
    bottom: each ratio's median over rounds, its bar the rounds' range."""
    fig, axes = _plot.figure("metrale bench batch", "bench batch: aggregate tok/s and ratios against clients",
                             rows=2, size=(9, 7.5))
    top, bottom = axes[0][0], axes[1][0]
    widths = sorted({p[0] for p in points})
    for name in dict.fromkeys(p[1] for p in points):  # systems in run order
        mine = [p for p in points if p[1] == name]
        line, = top.plot([p[0] for p in mine], [p[2] for p in mine], marker="o", label=name)
        rated = [(w, statistics.median(r), min(r), max(r)) for w, _, _, r in mine if r]
        if rated:
            ws, mid, lo, hi = zip(*rated)
            errors = ([m - a for m, a in zip(mid, lo)], [b - m for m, b in zip(mid, hi)])
            bottom.errorbar(ws, mid, yerr=errors, marker="o", capsize=3, color=line.get_color(),
                            label=RATIO_LABELS.get(name, name))  # a ratio wears its numerator's colour
    _plot.even(bottom)
    for ax, label in ((top, "aggregate tok/s"), (bottom, "tok/s ratio (median, range over rounds)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths, labels=[str(w) for w in widths])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    _plot.save(fig, path, last)


async def _one_run(name, server, worker, batchgen, prompts, ids, max_tokens, spec_steps: Counter):
    from runtime.bench.serving import stream_clients

    if name == "batchgen":  # on its own thread: the compiled graphs it builds are freed when that thread ends
        return await asyncio.get_running_loop().run_in_executor(worker, batchgen.run, ids, max_tokens)
    before = Counter(await _steps_by_kind(server))
    timing = await stream_clients(server.url, prompts, max_tokens, disable_mtp=name != "mtp_batch_on")
    if name == "mtp_batch_on":
        spec_steps.update(Counter(await _steps_by_kind(server)) - before)
    return timing


async def _steps_by_kind(server) -> dict[str, int]:
    from runtime.bench._served import scheduler_state

    return (await asyncio.to_thread(scheduler_state, server.url))["mtp_batch"]["steps_by_kind"]


def round_ratios(runs, baseline) -> list[float]:
    """The tok/s ratio within each round (runs and baseline paired by round)."""
    return [a.tok_s / b.tok_s for a, b in zip(runs, baseline)]


def _chat(text: str):
    from runtime.messages import ChatMessage

    return (ChatMessage(role="user", content=text),)
