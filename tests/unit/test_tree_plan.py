"""The tree planner (runtime/tree_plan.py): it keeps the alternatives that pay by measured costs and
hit rates, plans width 1 where none does, learns an extra node's cost and the head's calibration."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.tree_plan import EXPLORE_EVERY, EXPLORE_UNTIL, Candidate, TreePlanner
from tests.unit.test_speculation_policy import _table

TABLE = _table([10, 11, 12, 13], 0.5)  # plain 10 ms, each draft depth ~1 ms more (see its doc)
ACCEPT = [0.5, 0.5, 0.5]


def leaves(*probs):
    return [Candidate(depth=1, tokens=(100 + i,), prob=p) for i, p in enumerate(probs)]


def learned(per_node: float, steps: int = 40) -> TreePlanner:
    """A planner that has seen chain verifies at the table's cost and trees at per_node more each."""
    planner = TreePlanner(max_width=4)
    chain = TABLE.verify_cost(1, 3).ms
    for i in range(steps):
        planner.note_verify(TABLE, 3, 0, chain)
        planner.note_verify(TABLE, 3, 1 + i % 3, chain * math.exp(per_node * (1 + i % 3)))
    return planner


def test_a_likely_alternative_is_kept_when_nodes_are_cheap_and_not_when_dear():
    cheap, dear = learned(0.01), learned(0.5)
    assert cheap.choose(TABLE, ACCEPT, 1.875, 2.0, leaves(0.4, 0.01)) == leaves(0.4)[:1]
    assert dear.choose(TABLE, ACCEPT, 1.875, 2.0, leaves(0.4, 0.01)) == []


def test_the_best_alternatives_come_first_and_width_is_capped():
    planner = learned(0.001)
    kept = planner.choose(TABLE, ACCEPT, 1.875, 2.0, leaves(0.05, 0.3, 0.2, 0.25, 0.1))
    assert [c.prob for c in kept] == [0.3, 0.25, 0.2]  # max_width 4: three alternatives at most


def test_an_alternative_deeper_than_the_spine_reach_is_discounted():
    planner = learned(0.02)
    deep = Candidate(depth=3, tokens=(7,), prob=0.4)
    shallow = Candidate(depth=1, tokens=(8,), prob=0.4)
    assert planner.gain(deep, ACCEPT) == 0.25 * planner.gain(shallow, ACCEPT)


def test_the_extra_node_cost_is_learned_from_tree_verifies():
    assert abs(learned(0.2).snapshot()["extra_node_log_cost"] - 0.2) < 0.05
    assert abs(learned(0.01).snapshot()["extra_node_log_cost"] - 0.01) < 0.01


def test_hits_calibrate_the_head_and_misses_stop_the_alternatives():
    planner = learned(0.03)
    cand = leaves(0.5)
    assert planner.choose(TABLE, ACCEPT, 1.875, 2.0, cand) == cand
    for _ in range(200):  # reached, never the target's token
        planner.note_outcome(cand, spine_accepted=0, won=None)
    assert planner.hit_rate(1) < 0.1
    assert planner.choose(TABLE, ACCEPT, 1.875, 2.0, cand) == []


def test_an_alternative_not_reached_teaches_nothing():
    planner = TreePlanner(max_width=4)
    deep = Candidate(depth=3, tokens=(1,), prob=0.5)
    planner.note_outcome([deep], spine_accepted=1, won=None)  # the walk stopped before its parent
    assert planner.hit_rate(3) == 1.0


def test_ngram_ranks_learn_their_extra_tokens():
    planner = learned(0.01)
    rank1 = Candidate(depth=1, tokens=(1, 2, 3), nodes=3)
    for _ in range(50):
        planner.note_outcome([rank1], spine_accepted=0, won=rank1, extra={1: 2})
    assert planner.gain(rank1, ACCEPT) > 1.5
    assert planner.choose(TABLE, ACCEPT, 1.875, 2.0, [rank1]) == [rank1]


def test_unmeasured_node_costs_are_explored_now_and_then():
    planner = TreePlanner(max_width=4)
    dear = leaves(1e-6)  # pays by no estimate
    kept = [planner.choose(TABLE, ACCEPT, 1.875, 2.0, dear) for _ in range(EXPLORE_EVERY * 2)]
    assert sum(map(bool, kept)) == 2
    for m in range(EXPLORE_UNTIL):
        planner.note_verify(TABLE, 3, 1, 20.0)
    assert not any(planner.choose(TABLE, ACCEPT, 1.875, 2.0, dear) for _ in range(EXPLORE_EVERY * 2))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), max_size=8), st.floats(0.0, 0.3), st.integers(2, 6))
def test_what_it_keeps_is_a_best_first_prefix_of_at_most_width_minus_one(probs, per_node, width):
    planner = learned(per_node)
    planner.max_width = width
    kept = planner.choose(TABLE, ACCEPT, 1.875, 2.0, leaves(*probs))
    assert len(kept) <= width - 1
    ranked = sorted(leaves(*probs), key=lambda c: -c.prob)
    assert [c.prob for c in kept] == [c.prob for c in ranked[:len(kept)]]


def test_an_unmeasured_chain_is_verified_alone_now_and_then():
    """The chain's own cost is measured too: where alternatives always pay, every EXPLORE_EVERY-th
    step still verifies the spine alone until its cell has EXPLORE_UNTIL verifies."""
    planner = TreePlanner(max_width=4)
    likely = leaves(0.9)
    kept = [planner.choose(TABLE, ACCEPT, 1.875, 2.0, likely) for _ in range(EXPLORE_EVERY * 2)]
    assert sum(1 for k in kept if not k) == 2
    for _ in range(EXPLORE_UNTIL):
        planner.note_verify(TABLE, 3, 0, 13.0)
    assert all(planner.choose(TABLE, ACCEPT, 1.875, 2.0, likely) for _ in range(EXPLORE_EVERY * 2))
