"""The served actor system in this process, and a client for it: what benchmarks and calibration
measure, so that they measure what serves.

`Served(config, model_dir)` starts a `runtime.system.System`, the one `metrale serve` runs. A chat
question goes in through admission (tokenized there, as the server sends it); a prompt of token
ids goes to the scheduler as admission would send it (already tokenized; the context limit is
checked here). From the scheduler down (gate, planner, drafter, verifier, model owner) every step
is the served one. Against a hand loop over the engine, each step pays a few queue hops and one
hand-off to the owner thread: ~0.1 ms of a ~60-90 ms step of the default model.

Benches run several systems side by side (one per configuration), so a system is handed over only
once a start-up self-calibration (a server with no cost table times one while idle) is done: an
idle system must not time cells during another one's measured run.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator, Mapping, Sequence

import msgspec

from runtime.config import Config, override
from runtime.gateway import new_request_id, open_request
from runtime.messages import (
    Admitted, ChatMessage, Finished, SamplingParams, SpecReceipt, Submit, TokensEmitted, Usage,
)
from runtime.sequence import StepRecord, forget_steps, record_steps

Prompt = str | Sequence[int]  # a chat question (one user message), or prompt token ids


@dataclass
class Result:
    tokens: list[int]  # emitted, up to (not including) EOS
    usage: Usage
    seconds: float  # submit to the terminal event
    first_s: float  # submit to the first token (its end, where none came)
    steps: list[StepRecord] | None = None  # per verify step, where recorded

    @property
    def receipt(self) -> SpecReceipt:
        return self.usage.speculation


@dataclass
class Group:
    """Requests sent at once. marks: mark() read when they were sent, when the last of them had its
    first token (every prefill done), and when the last one ended."""

    results: list[Result]
    marks: tuple


def fixed_depth(config: Config, drafter: str, k: int, mtp_head: str | None = None) -> Config:
    """The served configuration speculating at depth k whenever eligible: gate forced, no planner."""
    return override(config, "spec", drafter=drafter, mtp_head=mtp_head, mtp_gate="force", cost_model="off",
                    num_draft_tokens=k)


def at_width(config: Config, width: int) -> Config:
    """Serial mode for one request at a time; continuous batching (mtp_batch) for `width` at once."""
    if width == 1:
        return override(config, "scheduler", mode="serial", max_active_requests=1)
    config = override(config, "scheduler", mode="mtp_batch", max_active_requests=width, batch_wait_ms=2.0)
    return override(config, "admission", max_pending=max(config.admission.max_pending, width))


def plain(params: SamplingParams) -> SamplingParams:
    """The same request with speculation off for it (disable_mtp): plain decode, as served."""
    return msgspec.structs.replace(params, disable_mtp=True)


class Served:
    """A started System (async with) and requests through it."""

    def __init__(self, config: Config, model_dir: Path):
        self.config, self.model_dir = config, model_dir
        self.system = None

    async def __aenter__(self) -> "Served":
        from runtime.bench.common import started_system

        self.system = await started_system(self.config, self.model_dir)
        await self.settled()
        return self

    async def settled(self) -> None:
        """Wait out the start-up self-calibration where one runs (a server with no cost table times
        one while idle): an idle system must not share the machine with another one's timed run."""
        while (self.system.scheduler.describe().get("self_calibration") or {}).get("running"):
            await asyncio.sleep(0.2)

    async def __aexit__(self, *exc) -> None:
        await self.system.stop()
        # The owner thread's exit runs MLX's thread-local destructors (its compile cache), which
        # take the GIL; if the interpreter is already finalizing then, the process aborts
        # ("terminate called without an active exception"). Sleeping frees the GIL for them.
        await asyncio.sleep(0.1)

    @property
    def codec(self):
        return self.system.codec

    async def generate(self, prompt: Prompt, params: SamplingParams, *, record: bool = False,
                       on_first: Callable[[], None] | None = None) -> Result:
        """One request to its end; record: keep a StepRecord per verify step. on_first is called
        once, at the first token (or at the end, where none came)."""
        request_id = new_request_id("bench")
        steps = record_steps(request_id) if record else None
        started, first, tokens, last = time.perf_counter(), None, [], None
        try:
            async with self._open(request_id, prompt, params) as events:
                async for last in events:
                    if not isinstance(last, TokensEmitted) or not last.token_ids:
                        continue
                    if first is None:
                        first = time.perf_counter()
                        if on_first:
                            on_first()
                    tokens.extend(last.token_ids)
        finally:
            forget_steps(request_id)
        if not isinstance(last, Finished):
            raise RuntimeError(f"benchmark request did not finish: {last}")
        ended = time.perf_counter()
        if first is None and on_first:
            on_first()
        return Result(tokens, last.usage, ended - started, (first or ended) - started, steps)

    async def group(self, prompts: Sequence[Prompt], params: SamplingParams,
                    mark: Callable[[], object] = time.perf_counter) -> Group:
        """Every prompt at once (a batch of len(prompts) in mtp_batch mode)."""
        marks, waiting = [mark()], [len(prompts)]

        def first() -> None:
            waiting[0] -= 1
            if not waiting[0]:
                marks.append(mark())

        results = await asyncio.gather(*(self.generate(p, params, on_first=first) for p in prompts))
        marks.append(mark())
        return Group(list(results), tuple(marks))

    def _open(self, request_id: str, prompt: Prompt, params: SamplingParams):
        messages = (ChatMessage(role="user", content=prompt),) if isinstance(prompt, str) else None
        submit = Submit(request_id=request_id, params=params, messages=messages)
        return open_request(self.system if messages else _Tokenized(self.system, tuple(prompt)), submit)


class _Tokenized:
    """Admission for a prompt already tokenized: checks the context and hands the scheduler the
    Admitted that admission would send. gateway.open_request does the rest as for any request."""

    def __init__(self, system, prompt_ids: tuple[int, ...]):
        self.system, self.prompt_ids = system, prompt_ids
        self.streamer, self.scheduler, self.admission = system.streamer, system.scheduler, self

    async def ask(self, submit: Submit) -> Admitted:
        ids, params, room = self.prompt_ids, submit.params, self.system.info.context_length
        if not ids or len(ids) + params.max_tokens > room:
            raise ValueError(f"{len(ids)} prompt tokens + max_tokens {params.max_tokens} do not fit "
                             f"the context ({room})")
        admitted = Admitted(request_id=submit.request_id, prompt_ids=ids, params=params,
                            submitted_at=submit.submitted_at)
        await self.scheduler.tell(admitted)
        return admitted


@contextmanager
def private_cache(config: Config) -> Iterator[Config]:
    """config with a temporary cache folder holding copies of the cache's cost tables: a system
    finds the prior a server would, and saves what it learns there, not in the user's cache."""
    from kernels.default_model import cache_dir

    with tempfile.TemporaryDirectory(prefix="metrale-bench-cache-") as tmp:
        tables = cache_dir(config.model.cache_dir) / "calibration"
        if tables.is_dir():
            shutil.copytree(tables, Path(tmp) / "calibration")
        yield override(config, "model", cache_dir=tmp)


@asynccontextmanager
async def served_all(configs: Mapping, model_dir: Path) -> AsyncIterator[dict]:
    """One started System per configuration (key -> Served), all stopped on the way out. Each
    holds its own copy of the weights (~0.7 GB for the default model)."""
    async with AsyncExitStack() as stack:
        yield {key: await stack.enter_async_context(Served(config, model_dir)) for key, config in configs.items()}
