"""The exploration budget: speculative steps run to learn, paid for from a bounded allowance.

Where the planner's best estimate says plain decode pays and the upper bound of acceptance says
drafting still might, a step may speculate to find out. Its cost is what it lost against plain
decode: its wall time less the plain cost of the tokens it emitted, and the excess of the plain
step after it, which starts with no lookahead in flight. A step that paid (drafts accepted) gives
its gain back to the allowance: exploration pays for itself where drafting pays, so a burst that
finds a paying cell goes on measuring it instead of waiting ~70 plain steps for the next (a fresh
server on code prompts decoded its first three requests plainly that way). Every step the planner
chose (plain, or speculative at the depth it expects to pay best) adds `share` of its wall time to
the allowance, so over any run exploration's net cost is at most `share` of the time spent decoding
as chosen (1% by default) plus one step; the allowance is capped, so a long plain spell cannot buy a
burst of losses later. Where speculation already pays, an exploration one depth deeper is charged
against what the chosen depth was expected to cost per token, not against plain decode
(runtime/step_plan.py), and never refunded. Each burst of explorations that all lost halves what chosen steps earn
(down to 1/64), and one that paid restores it: where drafting never pays, exploration fades to a
fraction of the share, and is still tried now and then.

Pure: the scheduler passes wall times in.
"""

from __future__ import annotations

import msgspec

DEFAULT_SHARE = 0.01
MISSES_PER_HALVING = 4  # a burst of exploring steps that all lost halves what plain steps earn
MAX_HALVINGS = 6  # down to 1/64 of the share: nothing is locked off for good


class ExplorationBudget(msgspec.Struct, kw_only=True):
    share: float = DEFAULT_SHARE
    cap_ms: float = 2000.0  # at most this much loss saved up
    allowance_ms: float = 0.0
    spent_ms: float = 0.0  # what exploration lost, all told
    earned_ms: float = 0.0  # what plain steps paid in, all told
    steps: int = 0
    misses: int = 0  # exploring steps in a row that lost against plain decode

    @property
    def rate(self) -> float:
        """What a plain step earns per ms: the share, halved for each losing burst in a row, so on a
        workload where drafting never pays exploration costs well under the share."""
        return self.share / 2 ** min(self.misses // MISSES_PER_HALVING, MAX_HALVINGS)

    def can_explore(self, expected_loss_ms: float) -> bool:
        return self.share > 0 and self.allowance_ms >= max(expected_loss_ms, 0.0)

    def note_chosen(self, wall_ms: float) -> None:
        earned = self.rate * max(wall_ms, 0.0)
        self.earned_ms += earned
        self.allowance_ms = min(self.cap_ms, self.allowance_ms + earned)

    def note_explored(self, wall_ms: float, baseline_ms_per_token: float, tokens_per_seq: float,
                      refund: bool = True) -> float:
        """Charge one exploring step; returns what it lost against its baseline (plain decode's ms per
        token, or the chosen depth's; below zero: it paid, and the gain goes back to the allowance
        where `refund`). An exploration deeper than a paying depth is not refunded: against a depth
        that pays, a lucky step's accepted drafts kept a losing depth 2 explored for 25 steps in a row
        on chat, each a few ms dearer than depth 1."""
        loss = wall_ms - baseline_ms_per_token * tokens_per_seq
        loss = loss if refund else max(loss, 0.0)
        self.allowance_ms = min(self.cap_ms, self.allowance_ms - loss)
        self.spent_ms += loss
        self.steps += 1
        self.misses = self.misses + 1 if loss > 0 else 0
        return loss

    def note_cold(self, wall_ms: float, warm_ms: float) -> float:
        """Charge the plain step after an exploration: it had no lookahead in flight, so it paid a
        whole forward's latency (warm_ms is a plain step's usual cost). Returns the excess."""
        loss = max(0.0, wall_ms - warm_ms)
        self.allowance_ms -= loss
        self.spent_ms += loss
        return loss

    def snapshot(self) -> dict:
        return {"share": self.share, "rate": self.rate, "allowance_ms": round(self.allowance_ms, 2),
                "spent_ms": round(self.spent_ms, 2), "earned_ms": round(self.earned_ms, 2), "steps": self.steps,
                "misses": self.misses}
