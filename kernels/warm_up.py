"""A server's first steps traced before it serves: a throwaway sequence runs each width-1 shape once.

The decoder layers run as compiled graphs traced once per input shape (kernels/compiled_blocks.py),
so a shape's first step pays its trace: on a 2-core Xeon the first verify of 1, 2 and 3 drafts took
74, 83 and 84 ms against 48, 56 and 61 ms after. That first speculative step is the one a fresh
server's online controller learns from first: its cost model took it as the cell's first reading and
its exploration budget as a 30 ms loss, and a fresh server decoded its first requests plainly.
Warming here runs the same engine calls a serial request does (prefill, plain step, drafts, verify,
roll back), so every later step of those shapes is warm.
"""

from __future__ import annotations

WARM_ID = "__warm_up__"
PROMPT_TOKENS = 16


def warm_up(engine, depths: int, vocab_size: int) -> None:
    """Run a plain step and a verify of 1..depths drafts (drafted by the engine's drafter where it
    has one) on a throwaway width-1 sequence, then drop it. Serial engines only: a batched engine's
    shapes change with its width."""
    if engine.batch is not None:
        return
    prompt = [(1000 + i) % vocab_size for i in range(PROMPT_TOKENS)]
    token = engine.prefill(WARM_ID, prompt, 0.0, 1.0, None, False, drafts=engine.drafter is not None)
    try:
        token = engine.decode([WARM_ID], [False])[0]
        for k in range(1, depths + 1):
            drafts = engine.propose(WARM_ID, k)[0] if engine.drafter is not None else [token] * k
            if not drafts:
                continue
            accepted, emitted = engine.verify(WARM_ID, drafts, False)
            engine.rollback(WARM_ID, len(drafts), accepted, emitted)
            token = emitted[-1]
    finally:
        engine.release(WARM_ID)
