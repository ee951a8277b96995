"""metrale bench pacing: inter-token latency of streamed answers, paced vs unpaced, speculation on.

A `metrale serve` subprocess speculating whenever eligible (--mtp-gate force, the default drafter,
K=3); each prompt is streamed twice, with stream_pacing true and false, in an order alternated per
prompt. Each token's arrival is timed at the client (the request asks for logprobs, so each chunk
lists its tokens); ITL is the gap between consecutive tokens of one answer, zero inside a burst.
Prints p50 / p99 / mean / standard deviation / CV of the ITL per config, and the total time.
Last line: itl_cv_paced=X itl_cv_unpaced=Y total_time_ratio=R (paced total over unpaced total).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from runtime.bench.common import table

PROMPTS = ["Explain how a bicycle gear works.", "Write a Python function that reverses a linked list.",
           "List five facts about the Moon.", "Describe how bread rises.",
           "Write a Python class for a queue with enqueue and dequeue."]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench pacing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    return asyncio.run(run(PROMPTS[:args.prompts], args.max_tokens))


async def run(prompts: list[str], max_tokens: int) -> int:
    from kernels.default_model import ensure_default_model
    from runtime.bench._served import ServedProcess

    extra = ["--mtp-gate", "force", "--spec-cost-model", "off", "--num-draft-tokens", "3"]
    with ServedProcess(ensure_default_model(), extra) as server:
        await stream(server.url, "Say hello.", 8, False)  # untimed warm-up
        runs: dict[bool, list[tuple[list[float], float, str]]] = {True: [], False: []}
        for i, prompt in enumerate(prompts):
            for pace in ((True, False) if i % 2 else (False, True)):
                runs[pace].append(await stream(server.url, prompt, max_tokens, pace))
    for a, b in zip(runs[True], runs[False]):
        if a[2] != b[2]:
            raise AssertionError("pacing changed an answer's text")
    return report(runs)


async def stream(url: str, prompt: str, max_tokens: int, pace: bool) -> tuple[list[float], float, str]:
    """(gaps between tokens, total seconds, text) of one streamed greedy answer."""
    import aiohttp
    import msgspec

    # logprobs: each chunk lists its tokens, so a burst in one chunk counts as that many arrivals
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_pacing": pace, "logprobs": True}
    arrivals, parts = [], []
    started = time.perf_counter()
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                chunk = msgspec.json.decode(line[6:])
                choice = chunk["choices"][0] if chunk["choices"] else {}
                tokens = len((choice.get("logprobs") or {}).get("content") or ())
                arrivals += [time.perf_counter()] * tokens
                parts.append(choice.get("delta", {}).get("content") or "")
    return [b - a for a, b in zip(arrivals, arrivals[1:])], time.perf_counter() - started, "".join(parts)


def summary(gaps: list[float]) -> dict[str, float]:
    ordered = sorted(gaps)
    mean = statistics.fmean(ordered)
    sd = statistics.pstdev(ordered)
    return {"p50": ordered[len(ordered) // 2], "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "mean": mean, "sd": sd, "cv": sd / mean if mean else 0.0}


def report(runs) -> int:
    rows, stats, totals = [], {}, {}
    for pace, results in runs.items():
        gaps = [g for run in results for g in run[0]]
        stats[pace], totals[pace] = summary(gaps), sum(run[1] for run in results)
        s = stats[pace]
        rows.append(["paced" if pace else "unpaced", len(gaps), round(1e3 * s["p50"], 1), round(1e3 * s["p99"], 1),
                     round(1e3 * s["mean"], 1), round(1e3 * s["sd"], 1), round(s["cv"], 3), round(totals[pace], 2)])
    print(table(["stream", "gaps", "itl_p50_ms", "itl_p99_ms", "itl_mean_ms", "itl_sd_ms", "itl_cv", "total_s"], rows))
    print(f"itl_cv_paced={stats[True]['cv']:.3f} itl_cv_unpaced={stats[False]['cv']:.3f} "
          f"total_time_ratio={totals[True] / totals[False]:.3f}")
    return 0
