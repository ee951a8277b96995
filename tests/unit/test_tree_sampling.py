"""Sampling over a draft tree keeps the target's distribution (kernels/tree.py's walk over
kernels/tree_verify.py's per-node draws): the first and second emitted tokens of 20k simulated steps
match the target by chi-square, on a context-free toy target over 8 tokens, for several trees and
nucleus settings; a classic broken multi-draft rule (each child tried in turn, no residual) fails."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from kernels.sampling import probs_from_logits
from kernels.tree import from_branches, walk
from kernels.tree_verify import _next_tokens
from tests.unit.test_acceptance import VOCAB, chi_square_pvalue

SAMPLES = 20_000
TREES = {
    "spine only": [[0, 1, 2]],
    "top-3 at the first position, leaves": [[0, 1, 2], [3], [5]],
    "alternative chains and a leaf at depth 2": [[0, 1, 2], [3, 4, 1], [0, 6], [7, 7]],
}


def toy_logits(seed: int, depth: int = 5) -> mx.array:
    """Context-free target: the next token's logits depend on the position only."""
    return 1.5 * mx.random.normal((depth, VOCAB), key=mx.random.key(seed))


def exact_rule(tree, logits, temperature, top_p, shift, key):
    """The served rule: one draw per node (as verify_tree draws them), then the walk."""
    depths = tree.depths()
    node_logits = mx.concatenate([logits[[d + shift for d in depths]]] * SAMPLES)  # [SAMPLES * T, V]
    state = SimpleNamespace(temperature=temperature, top_p=top_p, next_key=lambda: key)
    draws = np.array(_next_tokens(state, node_logits)).reshape(SAMPLES, len(depths))
    return [walk(tree, row)[1] for row in draws]


def children_in_turn(tree, logits, temperature, top_p, shift, key):
    """Broken: accept each child c in turn with probability p(c), else sample p itself (no residual)."""
    rng = np.random.default_rng(int(mx.random.randint(0, 2**31, key=key).item()))
    probs = np.array(probs_from_logits(logits, temperature, top_p), dtype=np.float64)
    kids = tree.children()
    out = []
    for _ in range(SAMPLES):
        node, emitted = 0, []
        while True:
            p = probs[tree.depth(node) + shift] if node else probs[shift]
            taken = next((child for token, child in kids[node].items() if rng.random() < p[token]), None)
            if taken is None:
                emitted.append(int(rng.choice(VOCAB, p=p / p.sum())))
                break
            emitted.append(tree.tokens[taken - 1])
            node = taken
        out.append(emitted)
    return out


def first_two(rule, tree, logits, temperature, top_p) -> tuple[np.ndarray, np.ndarray]:
    """The first two tokens of a decode: one tree step, and a next one where it emitted one token."""
    step1, step2 = mx.random.split(mx.random.key(7))
    now = rule(tree, logits, temperature, top_p, 0, step1)
    later = rule(tree, logits, temperature, top_p, 1, step2)
    first = np.array([e[0] for e in now])
    second = np.array([e[1] if len(e) > 1 else l[0] for e, l in zip(now, later)])
    return first, second


SETTINGS = [(1.0, 1.0), (0.7, 1.0), (1.5, 0.8)]


@pytest.mark.parametrize("name", TREES)
@pytest.mark.parametrize("temperature, top_p", SETTINGS)
def test_the_tree_walk_emits_the_target_distribution(name, temperature, top_p):
    logits, tree = toy_logits(3), from_branches(TREES[name])
    first, second = first_two(exact_rule, tree, logits, temperature, top_p)
    p = probs_from_logits(logits, temperature, top_p)
    assert chi_square_pvalue(first, p[0]) > 0.001 and chi_square_pvalue(second, p[1]) > 0.001


@pytest.mark.parametrize("name", list(TREES)[1:])
def test_the_check_catches_children_tried_in_turn(name):
    logits, tree = toy_logits(3), from_branches(TREES[name])
    first, _ = first_two(children_in_turn, tree, logits, 1.0, 1.0)
    assert chi_square_pvalue(first, probs_from_logits(logits, 1.0)[0]) < 1e-6


def test_the_toy_accepts_along_every_branch():
    """The test means something: draws walk into each root child and past depth one."""
    logits, tree = toy_logits(3), from_branches(TREES["alternative chains and a leaf at depth 2"])
    emitted = exact_rule(tree, logits, 1.0, 1.0, 0, mx.random.key(1))
    firsts = {e[0] for e in emitted if len(e) > 1}
    assert {0, 3, 7} <= firsts and max(len(e) for e in emitted) >= 3
