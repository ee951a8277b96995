"""metrale bench parity: greedy tok/s through the actor runtime vs a bare mlx-lm loop, interleaved.

Each round runs every prompt once through each path, alternating which goes first, so drift in the
machine's speed hits both. Last line: parity_ratio=R (runtime tok/s / bare tok/s, median of rounds).
"""

from __future__ import annotations

import argparse
import asyncio

from runtime.bench.common import median, started_system, table, timed_request
from runtime.messages import SamplingParams

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a hash table works.",
    "List five facts about the Moon.",
]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench parity", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    return asyncio.run(run(args.rounds, args.max_tokens))


async def run(rounds: int, max_tokens: int) -> int:
    from kernels.bare import BareGenerator

    system = await started_system()
    try:
        bare = BareGenerator(system.model_dir)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        rows, ratios = [], []
        await timed_request(system, PROMPTS[0], params=SamplingParams(max_tokens=8))  # warm-up
        for r in range(rounds):
            rt_tokens = rt_s = bare_tokens = bare_s = 0.0
            for i, question in enumerate(PROMPTS):
                ids = system.codec.encode(system.codec.chat_text(_chat(question)))
                order = ("runtime", "bare") if (r + i) % 2 == 0 else ("bare", "runtime")
                for path in order:
                    if path == "runtime":
                        tokens, seconds, _ = await timed_request(system, question, params=params)
                        rt_tokens, rt_s = rt_tokens + len(tokens), rt_s + seconds
                    else:
                        tokens, seconds = bare.greedy(ids, max_tokens, system.codec.eos_ids)
                        bare_tokens, bare_s = bare_tokens + len(tokens), bare_s + seconds
            ratio = (rt_tokens / rt_s) / (bare_tokens / bare_s)
            ratios.append(ratio)
            rows.append([r + 1, int(rt_tokens), rt_tokens / rt_s, int(bare_tokens), bare_tokens / bare_s, ratio])
        print(table(["round", "runtime_tokens", "runtime_tok_s", "bare_tokens", "bare_tok_s", "ratio"], rows))
        print(f"parity_ratio={median(ratios):.3f}")
    finally:
        await system.stop()
    return 0


def _chat(question: str):
    from runtime.messages import ChatMessage

    return (ChatMessage(role="user", content=question),)
