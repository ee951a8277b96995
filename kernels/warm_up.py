"""A server's first steps traced before it serves: a throwaway sequence runs each width-1 shape once.

The decoder layers run as compiled graphs traced once per input shape (kernels/compiled_blocks.py),
so a shape's first step pays its trace: on a 2-core Xeon the first verify of 1, 2 and 3 drafts took
74, 83 and 84 ms against 48, 56 and 61 ms after. The online controller learns nothing from such a
step (the owner's replies carry the trace count), but it still delays a request and drops what a
fresh server could have measured there: before either, a fresh server's controller took the first
exploring step as its cell's first reading and a 30 ms loss, and decoded its first requests plainly.
Warming here runs the same engine calls a serial request does (prefill, plain step, drafts, verify,
roll back), so every later step of those shapes is warm.
"""

from __future__ import annotations

from kernels.cell_timer import CellTimer

WARM_ID = "__warm_up__"
PROMPT_TOKENS = 16


def warm_up(engine, depths: int, vocab_size: int) -> None:
    """Run a plain step and a verify of 1..depths drafts (drafted by the engine's drafter where it
    has one) on a throwaway width-1 sequence, then drop it. Serial engines only: a batched engine's
    shapes change with its width."""
    if engine.batch is not None:
        return
    prompt = list(CellTimer.context_of(vocab_size)[:PROMPT_TOKENS])  # the self-calibration's context
    try:
        engine.prefill(WARM_ID, prompt, 0.0, 1.0, None, False, drafts=engine.drafter is not None)
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
