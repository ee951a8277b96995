"""The actor base: replies, typed failures, teardown, close twice, no leaked tasks."""

import asyncio

import pytest

from runtime.actor import Actor, Rejected
from runtime.messages import ActorFailure


class Echo(Actor):
    name = "echo"

    def __init__(self):
        super().__init__(inbox_size=4)
        self.torn_down = 0

    async def handle(self, msg):
        if msg == "boom":
            raise ValueError("bad message")
        if msg == "refuse":
            raise Rejected("no", 429)
        if msg == "slow":
            await asyncio.sleep(0.05)
        return ("echo", msg)

    async def teardown(self):
        self.torn_down += 1


async def test_ask_replies_and_failures_are_typed():
    actor = Echo()
    actor.start()
    assert await actor.ask(1) == ("echo", 1)
    with pytest.raises(ActorFailure, match="ValueError: bad message"):
        await actor.ask("boom")
    with pytest.raises(Rejected) as refused:
        await actor.ask("refuse")
    assert refused.value.status == 429
    assert await actor.ask(2) == ("echo", 2)  # the actor survived its handler's failure
    await actor.close()


async def test_close_is_safe_twice_and_tears_down_once():
    actor = Echo()
    actor.start()
    await actor.ask(1)
    await actor.close()
    await actor.close()
    assert actor.torn_down == 1
    with pytest.raises(ActorFailure):
        await actor.ask(3)


async def test_pending_asks_fail_when_the_actor_dies():
    actor = Echo()
    task = actor.start()
    slow = asyncio.ensure_future(actor.ask("slow"))
    queued = asyncio.ensure_future(actor.ask("never served"))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises((ActorFailure, asyncio.CancelledError)):
        await slow
    with pytest.raises(ActorFailure, match="stopped"):
        await queued


async def test_setup_failure_is_reported_by_started():
    class Broken(Echo):
        async def setup(self):
            raise RuntimeError("cannot load")

    actor = Broken()
    actor.start()
    with pytest.raises(RuntimeError, match="cannot load"):
        await actor.started()


async def test_no_tasks_leak():
    before = asyncio.all_tasks()
    actors = [Echo() for _ in range(3)]
    for a in actors:
        a.start()
    await asyncio.gather(*(a.ask(i) for i, a in enumerate(actors)))
    for a in actors:
        await a.close()
    assert asyncio.all_tasks() == before


async def test_an_actor_stuck_on_a_dead_peer_is_cancelled_at_close_and_torn_down():
    class Stuck(Echo):
        async def handle(self, msg):
            await asyncio.get_running_loop().create_future()  # a reply that never comes

    actor = Stuck()
    actor.start()
    asker = asyncio.ensure_future(actor.ask("x"))
    await asyncio.sleep(0.01)
    async with asyncio.timeout(5):
        await actor.close(timeout=0.1)
    assert actor._task.done() and actor.torn_down == 1
    with pytest.raises(ActorFailure):  # the asker is answered, not left waiting
        await asker
