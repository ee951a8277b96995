"""How wide a speculative step's draft tree is: the alternatives that pay, by measurement.

After the spine (the chain of K drafts the controller asked for) is drafted, each alternative is a
candidate: for the MTP head, a token among the head's next choices at spine depth j, hanging beside
spine token j as a leaf (its drafting is free: the head computed that distribution for the spine);
for n-gram lookup, a continuation found earlier in the text (beside an MTP spine too: prompt
lookup costs microseconds and often knows what the head does not). A candidate adds

    g = P(the walk reaches its parent) * P(it is the target's token)  [MTP leaf: one token]
    g = the mean extra tokens its rank gave over the spine so far    [n-gram branch]

expected tokens, and each extra node costs verify time. The step keeps the m best candidates that
maximise (E + sum of their g) / (D + V(K, m)): E the chain's expected tokens, D the draft time already
spent, V(K, m) the verify time of K spine and m extra nodes. So width 1 (m = 0) is planned wherever
no alternative pays, and the width follows what this machine's verify costs and this drafter's
alternatives are measured to be:
- V(K, m) = exp(L(K, m)), L the log of verify ms learned per cell from served tree and chain
  verifies (a clipped running mean, runtime/robust_estimate.py), shrunk toward
  L(K, 0) + m * s, s the learned log-cost of one extra node; L(K, 0) is shrunk toward the log of
  the cost table's verify(1, K). Absolute, not relative to a plain step: a reference that is itself
  still learning would move the cells observed at different times apart.
- E and P(reach depth j) come from the spine's own acceptance by position: this request's spine
  outcomes (decayed 0.95 per outcome), shrunk toward every request's (decayed 0.995), shrunk toward
  the cost table's chain acceptance. (The controller is told what the tree accepted, so that it
  chooses the depth of the step as run; the spine's own record is kept here.)
  P(target's token) = a_j * q, q the head's probability, a_j a calibration of hits over the summed q
  of alternatives that were reached (decayed), starting at 1 (q at face value).
Both sides of that comparison are measured, so neither is left to a guess: while fewer than
EXPLORE_UNTIL tree verifies have been seen, every EXPLORE_EVERY-th step with candidates keeps at
least one (one verify node, a few percent of a step); while a spine length's chain cell has fewer
than EXPLORE_UNTIL verifies, every EXPLORE_EVERY-th step verifies the spine alone (the serial step).
(The cost table's verify cell cannot stand in for the chain: the controller is told the tree steps
too, so there it is their mixture.)

Pure: no clock, no I/O, no MLX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from runtime.acceptance_online import PRIOR_TRIALS, REQUEST_TRIALS, Counts, posterior
from runtime.robust_estimate import RobustEstimate, shrunk

HIT_PRIOR = 1.0  # an alternative's head probability taken at face value until measured
HIT_MASS = 8.0  # pseudo-mass of that prior
DECAY = 0.995  # per tested alternative: the calibration remembers the last ~200
NGRAM_PRIOR = 0.25  # extra tokens an n-gram alternative adds before measured: optimistic, so it is tried
NGRAM_TRIALS = 4.0
NODE_PRIOR = 0.05  # log-cost of one extra verify node before measured (5% of a plain step)
EXPLORE_EVERY, EXPLORE_UNTIL = 16, 8
SPINE_DECAY, REQUEST_SPINE_DECAY = 0.995, 0.95


@dataclass(frozen=True)
class Candidate:
    depth: int  # MTP: beside spine token `depth`; n-gram: the branch's rank (1, 2, ...)
    tokens: tuple[int, ...]  # MTP: one token; n-gram: the whole continuation
    prob: float | None = None  # the head's probability (None for n-gram)
    nodes: int = 1  # new tree nodes it adds

    def branch(self, spine) -> list[int]:
        """The tokens from the root to its end."""
        return list(self.tokens) if self.prob is None else list(spine[:self.depth - 1]) + list(self.tokens)


@dataclass
class Calibration:
    """Decayed hits over summed probability (or extra tokens over trials, for n-gram ranks)."""

    mass: float = 0.0
    hits: float = 0.0

    def note(self, mass: float, hit: float) -> None:
        self.mass = self.mass * DECAY + mass
        self.hits = self.hits * DECAY + hit

    def rate(self, prior: float, strength: float) -> float:
        return (self.hits + strength * prior) / (self.mass + strength)


@dataclass
class TreePlanner:
    max_width: int
    verify: dict[tuple[int, int], RobustEstimate] = field(default_factory=dict)  # (K, m) -> log(verify ms)
    node: RobustEstimate = field(default_factory=RobustEstimate)  # one extra node's log-cost
    hits: dict[int, Calibration] = field(default_factory=dict)  # MTP: by spine depth; 0: all depths
    ngram: dict[int, Calibration] = field(default_factory=dict)  # n-gram: by rank
    spine_all: Counts = field(default_factory=Counts)  # every request's spine outcomes
    spine_request: tuple[str, Counts] = ("", Counts())  # the request being served (one at a time)
    steps: int = 0
    trees: int = 0

    # --- the spine's own acceptance -------------------------------------------------------------------
    def spine_acceptance(self, request_id: str, k: int, prior) -> list[float]:
        """P(spine draft t accepted | 1..t-1 were) for t = 1..k, this request's, shrunk as above."""
        base = posterior(self.spine_all, prior, PRIOR_TRIALS, k)
        own = self.spine_request[1] if self.spine_request[0] == request_id else Counts()
        return list(posterior(own, base, REQUEST_TRIALS, k))

    def note_spine(self, request_id: str, drafted: int, accepted: int) -> None:
        if self.spine_request[0] != request_id:
            self.spine_request = (request_id, Counts())
        self.spine_all.decay(SPINE_DECAY)
        self.spine_all.add(drafted, accepted)
        self.spine_request[1].decay(REQUEST_SPINE_DECAY)
        self.spine_request[1].add(drafted, accepted)

    # --- deciding ----------------------------------------------------------------------------------
    def choose(self, table, reach: list[float], chain_tokens: float, draft_ms: float,
               candidates: list[Candidate]) -> list[Candidate]:
        """The candidates to verify beside the spine (best gain first); [] plans width 1."""
        self.steps += 1
        k = len(reach)
        ranked = sorted(candidates, key=lambda c: -self.gain(c, reach))[:self.max_width - 1]
        best, best_rate, tokens, nodes = 0, chain_tokens / (draft_ms + self.verify_ms(table, k, 0)), chain_tokens, 0
        for m, cand in enumerate(ranked, start=1):
            tokens += self.gain(cand, reach)
            nodes += cand.nodes
            rate = tokens / (draft_ms + self.verify_ms(table, k, nodes))
            if rate > best_rate * (1 + 1e-12):
                best, best_rate = m, rate
        if self.steps % EXPLORE_EVERY == 0 and ranked:
            if not best and self.trees < EXPLORE_UNTIL:
                best = 1  # learn what an extra node costs here
            elif best and _count(self.verify.get((k, 0))) < EXPLORE_UNTIL:
                best = 0  # learn what the chain alone costs here
        return ranked[:best]

    def gain(self, cand: Candidate, reach: list[float]) -> float:
        if cand.prob is None:
            return self.ngram.setdefault(cand.depth, Calibration()).rate(NGRAM_PRIOR, NGRAM_TRIALS)
        return _reach(reach, cand.depth) * self.hit_rate(cand.depth) * cand.prob

    def hit_rate(self, depth: int) -> float:
        overall = self.hits.setdefault(0, Calibration()).rate(HIT_PRIOR, HIT_MASS)
        return self.hits.setdefault(depth, Calibration()).rate(overall, HIT_MASS)

    def verify_ms(self, table, k: int, m: int) -> float:
        """Verify ms of k spine and m extra nodes at this sequence's width of one."""
        chain = self._chain(table, k)
        if m == 0:
            return math.exp(chain)
        return math.exp(shrunk(self.verify.get((k, m)), chain + m * shrunk(self.node, NODE_PRIOR)))

    def _chain(self, table, k: int) -> float:
        return shrunk(self.verify.get((k, 0)), math.log(table.verify_cost(1, k).ms))

    # --- what happened -----------------------------------------------------------------------------
    def note_verify(self, table, k: int, m: int, ms: float) -> None:
        """A served verify of k spine and m extra nodes took ms (m = 0: a chain)."""
        if not ms > 0:
            return
        x = math.log(ms)
        if m:
            self.trees += 1
            self.node.update((x - self._chain(table, k)) / m)
        self.verify.setdefault((k, m), RobustEstimate()).update(x)

    def note_outcome(self, kept: list[Candidate], spine_accepted: int, won: Candidate | None,
                     extra: dict[int, int] | None = None) -> None:
        """MTP: the reached alternatives and which one the walk took; n-gram: each rank's extra
        tokens over the spine (extra[rank])."""
        for cand in kept:
            if cand.prob is None:
                self.ngram.setdefault(cand.depth, Calibration()).note(1.0, float((extra or {}).get(cand.depth, 0)))
            elif spine_accepted >= cand.depth - 1:  # the walk reached its parent: it was tried
                hit = float(cand is won)
                for key in (0, cand.depth):
                    self.hits.setdefault(key, Calibration()).note(cand.prob, hit)

    def snapshot(self) -> dict:
        return {"max_width": self.max_width, "steps": self.steps, "tree_verifies": self.trees,
                "spine_acceptance": [round(h / t, 3) if t else None
                                     for t, h in zip(self.spine_all.trials[:4], self.spine_all.hits[:4])],
                "extra_node_log_cost": round(shrunk(self.node, NODE_PRIOR), 4),
                "hit_calibration": {d: round(self.hit_rate(d), 3) for d in sorted(self.hits)},
                "ngram_extra_tokens": {r: round(c.rate(NGRAM_PRIOR, NGRAM_TRIALS), 3)
                                       for r, c in sorted(self.ngram.items())},
                "verify_cells": [{"k": k, "m": m, "count": e.count, "ms": round(math.exp(e.centre), 2)}
                                 for (k, m), e in sorted(self.verify.items())]}


def _reach(reach: list[float], depth: int) -> float:
    """P(the spine's first depth - 1 drafts are all accepted)."""
    out = 1.0
    for p in reach[:depth - 1]:
        out *= p
    return out


def _count(estimate: RobustEstimate | None) -> int:
    return estimate.count if estimate is not None else 0
