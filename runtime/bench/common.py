"""Helpers shared by benchmarks: an in-process actor system and timing of one request through it."""

from __future__ import annotations

import statistics
import time

from runtime.config import Config, load_config
from runtime.gateway import new_request_id, open_request
from runtime.messages import ChatMessage, Finished, SamplingParams, Submit, TokensEmitted


async def started_system(config: Config | None = None, model_dir=None):
    from kernels.default_model import ensure_default_model
    from runtime.system import System
    from runtime import tracing

    tracing.configure("json", level="warning")  # benchmarks print tables, not event logs
    system = System(config or load_config(), model_dir or ensure_default_model())
    await system.start()
    return system


async def timed_request(system, question: str | None = None, prompt: str | None = None,
                        params: SamplingParams = SamplingParams(temperature=0.0)) -> tuple[list[int], float, object]:
    """Token ids, wall seconds from submit to the terminal event, and that event."""
    messages = (ChatMessage(role="user", content=question),) if question is not None else None
    submit = Submit(request_id=new_request_id("bench"), params=params, messages=messages, prompt=prompt,
                    submitted_at=time.monotonic())
    started = time.perf_counter()
    tokens: list[int] = []
    async with open_request(system, submit) as events:
        async for event in events:
            if isinstance(event, TokensEmitted):
                tokens.extend(event.token_ids)
            last = event
    if not isinstance(last, Finished):
        raise RuntimeError(f"benchmark request did not finish: {last}")
    return tokens, time.perf_counter() - started, last


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells)
