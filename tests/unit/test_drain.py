"""The drain's bookkeeping: a closed door refuses with a 503, close waits only for what is open."""

import asyncio

import pytest

from runtime.drain import Drain
from runtime.messages import ActorFailure


async def test_close_waits_for_open_requests_up_to_its_timeout():
    drain = Drain()
    assert await drain.close(0)  # nothing open: drained at once, even with no time to wait
    drain = Drain()
    drain.enter()
    assert not await drain.close(0.05)  # still open when the time is up
    with pytest.raises(ActorFailure) as refused:
        drain.enter()
    assert refused.value.status == 503 and "shutting down" in refused.value.message
    drain = Drain()
    drain.enter()
    asyncio.get_running_loop().call_later(0.05, drain.leave)
    assert await drain.close(5) and drain.open == 0
