"""n > 1: several choices of one prompt, each its own sequence in the scheduler, their events merged
into one stream of (choice index, event) for the handler, and one usage for the request.

Choice i of a seeded request samples with seed + i, so choices differ and each is reproducible. The
prompt is counted once in usage (the choices share it); completion tokens and speculation receipts
add up. The choices are admitted together or not at all: one refused ends the others.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack, asynccontextmanager
from typing import AsyncIterator

import msgspec

from runtime.gateway import SlowClient, open_request
from runtime.messages import SpecReceipt, Submit, Usage, make_usage
from runtime.pacing import paced
from runtime.protocol import SEED_RANGE


def choice_submits(submit: Submit, n: int) -> list[Submit]:
    """The request's n sequences: ids rid, rid.1, ... and seeds seed + i."""
    if n == 1:
        return [submit]
    p = submit.params
    return [msgspec.structs.replace(
        submit, request_id=submit.request_id if i == 0 else f"{submit.request_id}.{i}",
        params=p if p.seed is None else msgspec.structs.replace(p, seed=(p.seed + i) % SEED_RANGE))
        for i in range(n)]


class Choices:
    """The merged events of a request's choices; `deliver` as one RequestStream's."""

    def __init__(self, streams, pace: bool = False):
        self.streams, self.pace = streams, pace

    async def deliver(self, sending, timeout: float) -> None:
        try:
            await self.streams[0].deliver(sending, timeout)
        except SlowClient:
            for s in self.streams[1:]:
                s.leave_reason = self.streams[0].leave_reason
            raise

    def __aiter__(self):
        return self._merged() if len(self.streams) > 1 else self._single()

    def _source(self, stream):
        return paced(stream) if self.pace else stream.__aiter__()

    async def _single(self):
        async for event in self._source(self.streams[0]):
            yield 0, event

    async def _merged(self):
        iterators = [self._source(s) for s in self.streams]
        pending = {asyncio.ensure_future(anext(it)): i for i, it in enumerate(iterators)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=pending.get):
                    i = pending.pop(task)
                    try:
                        event = task.result()
                    except StopAsyncIteration:
                        continue
                    yield i, event
                    pending[asyncio.ensure_future(anext(iterators[i]))] = i
        finally:
            for task in pending:
                task.cancel()


@asynccontextmanager
async def open_choices(system, submits: list[Submit], max_wait_s: float | None,
                       pace: bool = False) -> AsyncIterator[Choices]:
    async with AsyncExitStack() as stack:
        streams = [await stack.enter_async_context(open_request(system, s, max_wait_s)) for s in submits]
        yield Choices(streams, pace)


def merged_usage(usages: list[Usage]) -> Usage:
    """One usage for the request: its prompt once, every choice's completion tokens and receipt."""
    if len(usages) == 1:
        return usages[0]
    prompt = usages[0].prompt_tokens
    completion = sum(u.completion_tokens for u in usages)
    return make_usage(prompt, completion, merged_receipt([u.speculation for u in usages]),
                      usages[0].prompt_tokens_details.cached_tokens)


def merged_receipt(receipts: list[SpecReceipt]) -> SpecReceipt:
    def by_position(name: str) -> tuple[int, ...]:
        rows = [getattr(r, name) for r in receipts]
        width = max(map(len, rows), default=0)
        return tuple(sum(row[i] for row in rows if i < len(row)) for i in range(width))

    total = {f: sum(getattr(r, f) for r in receipts) for f in ("drafted_tokens", "accepted_tokens", "verify_steps",
                                                               "plain_steps", "verify_seconds", "plain_seconds",
                                                               "forced_tokens")}
    return SpecReceipt(**total, accepted_by_position=by_position("accepted_by_position"),
                       drafted_by_position=by_position("drafted_by_position"))
