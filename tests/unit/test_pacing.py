"""Paced streaming: the policy's properties (hypothesis) and the stream it paces (real time, short)."""

from __future__ import annotations

import asyncio
import statistics
import time

from hypothesis import given
from hypothesis import strategies as st

from runtime.messages import Finished, TokenLogprob, TokensEmitted, Usage
from runtime.pacing import Pacer, paced, split

bursts = st.lists(st.tuples(st.floats(0.001, 0.5), st.integers(1, 8)), min_size=1, max_size=30)


@given(bursts)
def test_tokens_go_in_order_never_early_and_never_held_past_one_gap(arrivals):
    pacer, now, last = Pacer(), 0.0, 0.0
    for gap, n in arrivals:
        now += gap
        times = pacer.plan(now, n)
        assert len(times) == n
        assert all(now <= t <= max(now + (pacer.gap or 0.0), last) + 1e-12 for t in times)
        assert all(a <= b for a, b in zip([last, *times], times))
        last = times[-1]


@given(st.floats(0.01, 0.5), st.integers(1, 8), st.integers(3, 20))
def test_a_steady_stream_is_paced_at_its_own_rate(period, n, count):
    pacer = Pacer()
    for i in range(count):
        times = pacer.plan(i * period, n)
    assert abs(pacer.interval - period / n) < 1e-9
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(abs(g - period / n) < 1e-9 for g in gaps)  # the burst fills its period, evenly


def test_split_cuts_the_text_evenly_and_keeps_each_tokens_logprobs():
    lps = tuple(TokenLogprob(token=t, logprob=-t / 10) for t in (4, 5, 6))
    pieces = split(TokensEmitted(request_id="r", token_ids=(4, 5, 6), text="abcdefg", index=10, logprobs=lps))
    assert "".join(p.text for p in pieces) == "abcdefg" and [p.index for p in pieces] == [10, 11, 12]
    assert [p.logprobs for p in pieces] == [(lp,) for lp in lps] and [p.token_ids for p in pieces] == [(4,), (5,), (6,)]


async def _bursts(period: float, n: int, count: int):
    for i in range(count):
        await asyncio.sleep(period)
        yield TokensEmitted(request_id="r", token_ids=tuple(range(n)), text="x" * n, index=i * n)
    yield Finished(request_id="r", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=n * count,
                                                                     total_tokens=1 + n * count))


async def _arrivals(source):
    out = []
    async for event in source:
        out.append((time.monotonic(), event))
    return out


async def test_paced_bursts_come_evenly_and_the_end_is_not_delayed():
    period, n, count = 0.08, 4, 8
    started = time.monotonic()
    raw = await _arrivals(_bursts(period, n, count))
    raw_seconds = time.monotonic() - started
    started = time.monotonic()
    got = await _arrivals(paced(_bursts(period, n, count)))
    paced_seconds = time.monotonic() - started
    tokens = [t for t, e in got if isinstance(e, TokensEmitted)]
    assert len(tokens) == n * count and isinstance(got[-1][1], Finished)
    gaps = [b - a for a, b in zip(tokens[n:], tokens[n + 1:])]  # after the first burst, which measures
    raw_tokens = [t for t, e in raw[1:] if isinstance(e, TokensEmitted) for _ in e.token_ids]
    raw_gaps = [b - a for a, b in zip(raw_tokens, raw_tokens[1:])]
    raw_cv = statistics.pstdev(raw_gaps) / statistics.mean(raw_gaps)
    assert raw_cv > 1.2  # bursts of 4 at once
    # Evenly in plan (the hypothesis tests above); here, wake-up jitter on a loaded machine allowed for.
    assert statistics.pstdev(gaps) / statistics.mean(gaps) < 0.6 * raw_cv, gaps
    assert paced_seconds < raw_seconds + period, (paced_seconds, raw_seconds)  # at most one interval more
