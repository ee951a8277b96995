"""One batch's draft depths, planned together: a step verifies every row to the same depth.

The batch verifier right-pads each row to the deepest row's drafts (kernels/batch_engine.py), so a
step that verifies any row D drafts deep costs verify(n, D) whatever the other rows draft, plus the
drafter's cost for the rows that draft: draft(m, D) for m drafting rows. Planned one sequence at a
time (propose_depth, as if the batch were all sequences like it), one hopeful row's depth-1 draft
was priced at a quarter of a width-4 verify: on a 2-core Xeon such steps cost 64 ms against a
51 ms plain step and 70 ms with every row drafting, for half a token.

So the plan is chosen over the batch. For each depth D and each m, the m sequences whose drafts add
the most tokens at D draft D deep and the others take plain rows. A sequence's step time is the
whole step's; its joules are its share of the verify plus its own drafts'. Sequences of one
objective are scored together as propose_depth scores a batch (their tokens over their ms and
joules), against plain decode, under the same floors: "balanced" no slower than plain, "energy" at
least (1 - slack) times as fast as with every row drafting at depth 1. The plan maximises the sum
over sequences of the log of their objective's gain over plain, so one objective cannot buy its
gain with a larger loss to another's. Ties keep plain, then the shallower depth and fewer rows. For
a batch of alike sequences this is propose_depth's choice.

Pure: no clock, no I/O, deterministic.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

from runtime.cost_table import Cost, CostTable
from runtime.plan import expected_tokens, prior_at

_TIE = 1e-12
# Weights of (log ms, log joules) in each objective's score: propose_depth's scores, in logs.
_WEIGHTS = {"latency": (1.0, 0.0), "energy": (0.0, 1.0), "balanced": (0.5, 0.5)}
_ORDER = {"latency": 0, "balanced": 1, "energy": 2}  # equal gains: who drafts first

Row = tuple[str, Sequence[float]]  # (objective, P(accept) at draft positions 1..)


def batch_depths(rows: Sequence[Row | None], table: CostTable, *, max_k: int, slack: float) -> tuple[int, ...]:
    """Each row's depth (None: not eligible, a plain row); see the module doc."""
    n = len(rows)
    seqs = [(i, row[0], row[1]) for i, row in enumerate(rows) if row is not None]
    if not seqs or max_k < 1:
        return (0,) * n
    depths = [k for k in table.depths if 1 <= k <= max_k]
    sizes, plain = Counter(objective for _, objective, _ in seqs), table.step_cost(n, 0)
    score = _Scorer(sizes, plain, n, _floors(seqs, sizes, table, n, plain, slack, 1 in depths))
    best_value = score(Counter(), plain, Cost(ms=0.0, joules=0.0), Counter(), 0)
    best: tuple[int, tuple[int, ...]] = (0, ())
    for depth in depths:
        for m, order, tokens, drafting in _prefixes(seqs, depth):
            value = score(tokens, *plan_cost(table, n, depth, m), drafting, m)
            if value is not None and (best_value is None or value > best_value + _TIE * max(1.0, abs(best_value))):
                best_value, best = value, (depth, tuple(i for i, _, _ in order[:m]))
    depth, chosen = best
    return tuple(depth if i in chosen else 0 for i in range(n))


def plan_cost(table: CostTable, n: int, depth: int, drafting: int) -> tuple[Cost, Cost]:
    """(verify, draft) of a step of n rows verified `depth` deep with `drafting` of them drafting."""
    return table.verify_cost(n, depth), table.draft_cost(drafting, depth) if drafting else Cost(ms=0.0, joules=0.0)


def _prefixes(seqs, depth: int):
    """(m, order, tokens added, drafting rows) per objective, for the m sequences whose drafts add the
    most tokens at this depth, m = 1..all."""
    gains = {i: _gain(rates, depth) for i, _, rates in seqs}
    order = sorted(seqs, key=lambda s: (-gains[s[0]], _ORDER[s[1]], s[0]))
    tokens, drafting = Counter(), Counter()
    for m, (i, objective, _) in enumerate(order, start=1):
        tokens[objective] += gains[i]
        drafting[objective] += 1
        yield m, order, tokens, drafting


def _floors(seqs, sizes: Counter, table: CostTable, n: int, plain: Cost, slack: float,
            has_depth_1: bool) -> dict[str, float]:
    """The least tokens per ms each objective's sequences must make: balanced plain decode's, energy
    (1 - slack) times theirs with every sequence drafting at depth 1 (plain's where no depth 1)."""
    floors = {"balanced": sizes["balanced"] / plain.ms}
    if sizes["energy"]:
        energy = [rates for _, objective, rates in seqs if objective == "energy"]
        made, ms = len(energy), plain.ms
        if has_depth_1:
            verify, draft = plan_cost(table, n, 1, len(seqs))
            made, ms = made + sum(_gain(rates, 1) for rates in energy), verify.ms + draft.ms
        floors["energy"] = (1.0 - slack) * made / ms
    return floors


def _gain(rates: Sequence[float], depth: int) -> float:
    """Tokens a sequence's drafts add at this depth."""
    return expected_tokens([prior_at(rates, t) for t in range(1, depth + 1)]) - 1.0


class _Scorer:
    """A plan's value: the sum over sequences of log(their objective's score / plain's); None where
    some objective's floor is missed. A sequence's ms are the step's; its joules its share of the
    verify and its drafting rows' share of the drafts."""

    def __init__(self, sizes: Counter, plain: Cost, n: int, floors: dict[str, float]):
        self.sizes, self.plain, self.n, self.floors = sizes, plain, n, floors

    def __call__(self, tokens: Counter, verify: Cost, draft: Cost, drafting: Counter, m: int) -> float | None:
        ms, value = verify.ms + draft.ms, 0.0
        for objective, size in self.sizes.items():
            made = size + tokens[objective]
            if made / ms < self.floors.get(objective, 0.0) * (1.0 - _TIE):
                return None
            joules = size / self.n * verify.joules + (drafting[objective] / m * draft.joules if m else 0.0)
            w_ms, w_j = _WEIGHTS[objective]
            value += size * (math.log(made / size) - w_ms * math.log(ms / self.plain.ms)
                             - w_j * math.log(max(joules, 1e-12) / max(size / self.n * self.plain.joules, 1e-12)))
        return value
