"""metrale bench parity: greedy tok/s through the actor runtime vs a bare mlx-lm loop, interleaved.

The runtime runs in this process (runtime/bench/_inprocess.py) twice: with speculation off
(`--drafter none`: plain decode only, so the ratio is the overhead the actors add, not what
speculation's probes cost or gain) and in the default configuration (what `metrale serve` runs
with no arguments, speculation included; it reads the cache's cost tables from a private copy, so
what it learns is not saved there, and a start-up self-calibration, where one runs, is waited out
before timing). Each round runs every prompt once through each of the three paths, in an order
rotated per prompt, so drift in the machine's speed hits all.
Last line: parity_ratio=R (speculation-off runtime tok/s / bare tok/s, median of rounds)
default_ratio=R (default runtime tok/s / bare tok/s, likewise).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass

from runtime.bench.common import median, table
from runtime.messages import SamplingParams

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a hash table works.",
    "List five facts about the Moon.",
]
PATHS = ("off", "default", "bare")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    return asyncio.run(run(args.rounds, args.max_tokens))


async def run(rounds: int, max_tokens: int) -> int:
    from kernels.bare import BareGenerator
    from kernels.default_model import ensure_default_model
    from runtime.bench._inprocess import private_cache, served_all
    from runtime.config import load_config, override

    model_dir = ensure_default_model()
    off = override(load_config(), "spec", drafter="none")
    with private_cache(load_config()) as default:  # the default reads the cache's tables, writes none there
        async with served_all({"off": off, "default": default}, model_dir) as clients:
            paths = dict(clients, bare=Bare(BareGenerator(model_dir), clients["off"].codec))
            for path in PATHS:  # untimed warm-up
                await paths[path].generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=8))
            rows = [await _round(paths, r, max_tokens) for r in range(rounds)]
    print(table(["round", "off_tokens", "off_tok_s", "default_tokens", "default_tok_s", "bare_tokens",
                 "bare_tok_s", "ratio", "default_ratio"], rows))
    print(f"parity_ratio={median([r[-2] for r in rows]):.3f} default_ratio={median([r[-1] for r in rows]):.3f}")
    return 0


async def _round(paths: dict, r: int, max_tokens: int) -> list:
    """Every prompt through every path (order rotated per prompt); the round's table row."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    totals = {path: [0, 0.0] for path in PATHS}
    for i, question in enumerate(PROMPTS):
        shift = (r + i) % len(PATHS)
        for path in PATHS[shift:] + PATHS[:shift]:
            result = await paths[path].generate(question, params)
            totals[path][0] += len(result.tokens)
            totals[path][1] += result.seconds
    rate = {path: tokens / seconds for path, (tokens, seconds) in totals.items()}
    return [r + 1, totals["off"][0], rate["off"], totals["default"][0], rate["default"], totals["bare"][0],
            rate["bare"], rate["off"] / rate["bare"], rate["default"] / rate["bare"]]


@dataclass
class Timed:
    tokens: list[int]
    seconds: float


class Bare:
    """The bare mlx-lm loop behind the same call as the runtime's client."""

    def __init__(self, generator, codec):
        self.generator, self.codec = generator, codec

    async def generate(self, question: str, params: SamplingParams) -> Timed:
        ids = self.codec.encode(self.codec.chat_text(_chat(question)))
        return Timed(*self.generator.greedy(ids, params.max_tokens, self.codec.eos_ids))


def _chat(question: str):
    from runtime.messages import ChatMessage

    return (ChatMessage(role="user", content=question),)
