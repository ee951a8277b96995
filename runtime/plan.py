"""The measured cost-model planner (spec/plan.md): how deep to draft, and how many drafts to verify.

Let p(t) be P(draft t is accepted | drafts 1..t-1 were). A sequence that drafts K tokens emits

    E[tokens](K) = 1 + sum_{j=1..K} prod_{t=1..j} p(t)

(the token the verifier always emits, plus each draft whose whole prefix was accepted), and a step
of n sequences at depth K costs C(n, K) = verify(n, K) + draft(n, K), in ms and joules, from the
calibration table (runtime/cost_table.py).

propose_depth, before drafting: the K in 0..max_k (among the table's depths) maximising
n E[tokens](K) / C_joules(n, K), among the K whose n E[tokens](K) / C_ms(n, K) is at least
(1 - slack) times depth 1's (depth 0's when the table has no depth 1). Ties keep the shallower K.
That is the spec's rule, objective "energy". A request may ask for another objective: "latency"
takes the K with the most tokens per ms (no floor); "balanced" (the served default) the K with the
best geometric mean of tokens per ms and tokens per joule among the K at least as fast as plain
decode (depth 0): a request never gets slower for the energy it saves.
Above mtp_max_seqs the scheduler plain-decodes regardless, so it answers 0 for reason "over_cap"
without reading the table; a 0 for reason "cost_model" means drafting does not pay here.

sequence_depths, after drafting: sequence i's j-th draft adds g_i(j) = prod_{t<=j} p_i(t) tokens.
g_i is non-increasing in j (a running product of numbers <= 1), so for any total of R rows the
tokens-maximising allocation takes every sequence's first draft and then the largest remaining
gains (an exchange argument). The drafts are paid for, so R rows cost verify(n, R / n) only. Verify
cost is not monotone in rows, so R is chosen by scanning every reachable R for the best
tokens / joules (a row that does not pay can precede a cheaper one). Ties keep the smaller R and
the earlier sequence.

Pure: no clock, no I/O, deterministic. Relative differences under 1e-12 count as ties, so float
noise never buys depth.
"""

from __future__ import annotations

from typing import Literal, Sequence

import msgspec

from runtime.cost_table import AcceptanceCalibration, Cost, CostTable, interpolate

_TIE = 1e-12

DepthReason = Literal["over_cap", "cost_model"]
Objective = Literal["energy", "latency", "balanced"]
OBJECTIVES: tuple[Objective, ...] = ("energy", "latency", "balanced")


class DepthChoice(msgspec.Struct, frozen=True, kw_only=True):
    """propose_depth's answer; the rates are the batch's expected ones (None when over the cap)."""

    depth: int
    reason: DepthReason
    tokens_per_ms: float | None = None
    tokens_per_joule: float | None = None


def expected_tokens(probs: Sequence[float]) -> float:
    """Tokens one sequence emits when its drafts are accepted with these chained probabilities."""
    total, chain = 1.0, 1.0
    for p in probs:
        chain *= p
        total += chain
    return total


def prior_at(prior: Sequence[float], position: int) -> float:
    """P(accept) of draft `position` (1-based); positions past the prior's end repeat its last."""
    if not prior:
        return 0.0
    return prior[min(position, len(prior)) - 1]


def propose_depth(
    n: int,
    *,
    table: CostTable,
    prior: Sequence[float],
    max_k: int,
    slack: float,
    mtp_max_seqs: int,
    objective: Objective = "energy",
) -> DepthChoice:
    """The draft depth for a batch of n sequences (see the module doc)."""
    if n > mtp_max_seqs:
        return DepthChoice(depth=0, reason="over_cap")
    _check_probabilities("prior", prior)
    _check_probabilities("slack", (slack,))
    if max_k < 0:
        raise ValueError(f"max_k must be at least 0, got {max_k}")
    verify, draft = table.verify_row(n), table.draft_row(n)
    rates = {
        k: _depth_rates(n * expected_tokens(_priors(prior, k)), verify[j] + draft[j])
        for j, k in enumerate(table.depths)
        if k <= max_k
    }
    floor = _floor(rates, slack, objective)
    feasible = [k for k, (per_ms, _) in rates.items() if per_ms >= floor * (1.0 - _TIE)]  # a tie reaches the floor
    score = _SCORES[objective]
    best = feasible[0]
    for k in feasible[1:]:  # ascending, so a tie keeps the shallower depth
        if score(rates[k]) > score(rates[best]) * (1.0 + _TIE):
            best = k
    return DepthChoice(
        depth=best,
        reason="cost_model",
        tokens_per_ms=rates[best][0],
        tokens_per_joule=rates[best][1],
    )


def _floor(rates: dict[int, tuple[float, float]], slack: float, objective: Objective) -> float:
    """The least tokens per ms a depth must reach to be chosen."""
    if objective == "latency":
        return 0.0
    if objective == "balanced":
        return rates[min(rates)][0]  # plain decode's own speed (depth 0 where the table has it)
    return (1.0 - slack) * rates[1 if 1 in rates else 0][0]


_SCORES = {
    "energy": lambda rate: rate[1],
    "latency": lambda rate: rate[0],
    "balanced": lambda rate: (rate[0] * rate[1]) ** 0.5,
}


def _priors(prior: Sequence[float], depth: int) -> list[float]:
    return [prior_at(prior, t) for t in range(1, depth + 1)]


def _depth_rates(tokens: float, cost: Cost) -> tuple[float, float]:
    """Tokens per ms and per joule."""
    return tokens / cost.ms, tokens / cost.joules


def sequence_depths(
    table: CostTable,
    drafts: Sequence[Sequence[float]],
    *,
    prior: Sequence[float],
    max_k: int,
    row_budget: int,
    known_drafts: Sequence[int] = (),
    calibration: AcceptanceCalibration | None = None,
) -> tuple[int, ...]:
    """Drafts to verify per sequence, in the caller's (slot) order (see the module doc).

    drafts[i] is sequence i's draft confidences (top-1 log-probabilities, in draft order); its
    length is how many drafts it has, unless known_drafts[i] says more: those drafts have no
    confidences and take the prior. calibration defaults to the table's.
    """
    n = len(drafts)
    if known_drafts and len(known_drafts) != n:
        raise ValueError(f"known_drafts has {len(known_drafts)} entries for {n} sequences")
    _check_probabilities("prior", prior)
    if n == 0 or n > row_budget or max_k <= 0:
        return (0,) * n  # over the row budget: a plain decode step
    cal = calibration if calibration is not None else table.calibration
    gains = [
        _chained_gains(conf, known_drafts[i] if known_drafts else 0, cal, prior, max_k)
        for i, conf in enumerate(drafts)
    ]
    depths = [min(1, len(g)) for g in gains]
    extra = _extra_rows_in_order(gains)
    rows = _best_row_count(table, n, gains, extra, row_budget)
    for seq, _ in extra[: rows - sum(depths)]:
        depths[seq] += 1
    return tuple(depths)


def _chained_gains(
    confidences: Sequence[float],
    known: int,
    cal: AcceptanceCalibration,
    prior: Sequence[float],
    max_k: int,
) -> list[float]:
    """g(j) = prod_{t<=j} p(t) for j = 1..min(drafts, max_k): the tokens draft j adds."""
    count = min(max(len(confidences), known), max_k)
    gains, chain = [], 1.0
    for t in range(1, count + 1):
        p = cal.p_accept(confidences[t - 1]) if t <= len(confidences) else prior_at(prior, t)
        chain *= p
        gains.append(chain)
    return gains


def _extra_rows_in_order(gains: list[list[float]]) -> list[tuple[int, float]]:
    """(sequence, gain) of the rows beyond each first draft, largest gain first.

    Each sequence's gains are non-increasing, so this order takes every sequence's drafts as a
    prefix; equal gains go to the earlier sequence.
    """
    keyed = sorted((-g, seq, j) for seq, gs in enumerate(gains) for j, g in enumerate(gs) if j > 0)
    return [(seq, -neg_gain) for neg_gain, seq, _ in keyed]


def _best_row_count(
    table: CostTable,
    n: int,
    gains: list[list[float]],
    extra: list[tuple[int, float]],
    row_budget: int,
) -> int:
    """The R with the best tokens / verify joules over every reachable R (ties: smaller R)."""
    first_rows = sum(min(1, len(g)) for g in gains)
    if first_rows == 0:
        return 0
    joules = [cell.joules for cell in table.verify_row(n)]

    def tokens_per_joule(rows: int, tokens: float) -> float:
        return tokens / interpolate(table.depths, joules, rows / n)

    tokens = n + sum(g[0] for g in gains if g)
    best_rows, best = first_rows, tokens_per_joule(first_rows, tokens)
    last = min(row_budget, first_rows + len(extra))
    for rows in range(first_rows + 1, last + 1):
        tokens += extra[rows - first_rows - 1][1]
        ratio = tokens_per_joule(rows, tokens)
        if ratio > best * (1.0 + _TIE):
            best_rows, best = rows, ratio
    return best_rows


def _check_probabilities(name: str, values: Sequence[float]) -> None:
    if not all(0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"{name} must lie in [0, 1], got {tuple(values)}")
