"""metrale bench batch: aggregate tok/s and inter-token latency at 1..32 concurrent clients.

Side by side in one run, on the default model with the same prompts: mlx-lm's own BatchGenerator
(no speculation, in this process), metrale mtp_batch with speculation off (disable_mtp per request)
and with speculation on (gate and planner on), both through a real server on loopback with one
streaming client per request. Each width runs --rounds rounds, the three systems in an order
rotated per round so machine drift hits all alike; a system's figures pool its rounds (tokens over
seconds; latency percentiles over every gap). Last line: min_ratio_off_vs_batchgen=R
min_ratio_on_vs_off=R (the smallest pooled ratio over the widths).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from runtime.bench.common import table

PROMPTS = ["Write a short story about a robot learning to paint.", "Explain how a bicycle works.",
           "List some tips for learning a new language.", "Write a Python function that sorts a list.",
           "Describe the water cycle.", "What makes a good cup of coffee?",
           "Write a poem about the ocean.", "How do airplanes stay in the air?"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench batch", description=__doc__)
    parser.add_argument("--widths", default="1,4,8,16,32")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per width, order rotated")
    parser.add_argument("--port", type=int, default=0, help="0: a free loopback port")
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    return asyncio.run(run(widths, args.max_tokens, args.rounds, args.port))


SYSTEMS = ("batchgen", "mtp_batch_off", "mtp_batch_on")


async def run(widths: list[int], max_tokens: int, rounds: int, port: int) -> int:
    from kernels.bare import BatchGeneratorRunner
    from runtime.bench.serving import LoopbackServer, pooled, stream_clients

    async with LoopbackServer(max(widths), port) as server:
        codec = server.system.codec
        batchgen = BatchGeneratorRunner(server.system.model_dir, codec.eos_ids)
        rows, off_ratios, on_ratios = [], [], []
        for width in widths:
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(width)]
            ids = [codec.encode(codec.chat_text(_chat(p))) for p in prompts]
            runs = {name: [] for name in SYSTEMS}
            for r in range(rounds):
                for name in SYSTEMS[r % 3:] + SYSTEMS[:r % 3]:
                    runs[name].append(batchgen.run(ids, max_tokens) if name == "batchgen" else
                                      await stream_clients(server.url, prompts, max_tokens, name == "mtp_batch_off"))
            results = {name: pooled(runs[name]) for name in SYSTEMS}
            for name, r in results.items():
                rows.append([width, name, r.tokens, r.tok_s, r.itl_p50 * 1000, r.itl_p99 * 1000])
            off_ratios.append(results["mtp_batch_off"].tok_s / results["batchgen"].tok_s)
            on_ratios.append(results["mtp_batch_on"].tok_s / results["mtp_batch_off"].tok_s)
    print(table(["clients", "system", "tokens", "agg_tok_s", "itl_p50_ms", "itl_p99_ms"], rows))
    print(f"min_ratio_off_vs_batchgen={min(off_ratios):.3f} min_ratio_on_vs_off={min(on_ratios):.3f}")
    return 0


def _chat(text: str):
    from runtime.messages import ChatMessage

    return (ChatMessage(role="user", content=text),)
