"""Benchmark plumbing: timed streaming chat clients of a metrale server on loopback."""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from dataclasses import dataclass

import aiohttp


@dataclass
class Timing:
    tokens: int
    seconds: float
    gaps: list[float]  # seconds between token arrivals, over every client

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def itl_p50(self) -> float:
        return statistics.median(self.gaps) if self.gaps else 0.0

    @property
    def itl_p99(self) -> float:
        gaps = sorted(self.gaps) or [0.0]
        return gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]


def timing(tokens: int, seconds: float, gaps: list[float]) -> Timing:
    return Timing(tokens, seconds, list(gaps))


def pooled(runs: list[Timing]) -> Timing:
    """Several runs as one: their tokens over their seconds, every gap in the percentiles."""
    return Timing(sum(r.tokens for r in runs), sum(r.seconds for r in runs), [g for r in runs for g in r.gaps])


async def stream_clients(url: str, prompts: list[str], max_tokens: int, disable_mtp: bool) -> Timing:
    """One streaming chat client per prompt, all at once; token counts come from usage."""
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        results = await asyncio.gather(*(_client(http, url, p, max_tokens, disable_mtp) for p in prompts))
    seconds = time.perf_counter() - started
    return timing(sum(n for n, _ in results), seconds, [g for _, gaps in results for g in gaps])


async def _client(http, url: str, prompt: str, max_tokens: int, disable_mtp: bool) -> tuple[int, list[float]]:
    import msgspec

    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "disable_mtp": disable_mtp,
            # Every system computes each prompt: rounds repeat the prompts, and a later system hitting
            # an earlier one's cache entries (speculating and plain requests keep apart ones) timed
            # the prompt cache, not batching: an A/A pair of identical systems ran 0.88x at 16 clients.
            "cache_prompt": False}
    arrivals, tokens = [], 0
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = msgspec.json.decode(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
    return tokens, [b - a for a, b in zip(arrivals, arrivals[1:])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
