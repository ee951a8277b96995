"""Draft trees: several continuations of one sequence merged into a trie, and how a verify walks it.

Node 0 is the root: the sequence's last token, whose cache entry the verify forward writes. Nodes
1..N are draft tokens; node i has token tokens[i - 1] and parent parents[i - 1] (0: the root), and
parents come before children. Branch b ends at node leaves[b]; branch 0 is the spine (the chain the
serial path would have verified), inserted first, so its nodes are 1..K in order and a path along it
needs no cache entries moved.

A verify draws one "next token" per node from the target (its argmax when greedy, a sample from its
distribution otherwise) and walks from the root: while the node's next token is one of its
children, move there; the tokens passed and the last next token are emitted. Greedy, that is
exactly plain decode. Sampling, every emitted token is a fresh draw from the target given what
precedes it (each node has its own draw), so the target's distribution is kept for any drafts:
multi-draft rejection sampling with deterministic drafts (accept child c with probability p(c),
else the residual p with the children removed, is the same rule drawn in one go).

Pure Python, no MLX: the scheduler builds trees and kernels/tree_verify.py runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    leaves: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def width(self) -> int:
        return len(self.leaves)

    def depth(self, node: int) -> int:
        d = 0
        while node:
            node, d = self.parents[node - 1], d + 1
        return d

    def depths(self) -> list[int]:
        """Depth of every node, root (0) included."""
        out = [0]
        for parent in self.parents:
            out.append(out[parent] + 1)
        return out

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to node."""
        nodes = []
        while node:
            nodes.append(node)
            node = self.parents[node - 1]
        return nodes[::-1]

    def branch(self, b: int) -> list[int]:
        return [self.tokens[n - 1] for n in self.path(self.leaves[b])]

    def children(self) -> list[dict[int, int]]:
        """children()[node] maps a token to the child node carrying it."""
        out: list[dict[int, int]] = [{} for _ in range(self.size + 1)]
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents), start=1):
            out[parent][token] = i
        return out

    def ancestors(self) -> list[list[int]]:
        """ancestors()[node]: the nodes it attends to among the new ones (root, ..., itself)."""
        out = [[0]]
        for i, parent in enumerate(self.parents, start=1):
            out.append(out[parent] + [i])
        return out


def from_branches(branches: Sequence[Sequence[int]]) -> DraftTree:
    """The trie of the branches (shared prefixes merged); branch 0 first. Empty and duplicate
    branches are dropped; an alternative that only repeats a prefix of another one adds no node."""
    return trie(branches)[0]


def trie(branches: Sequence[Sequence[int]]) -> tuple[DraftTree, list[int]]:
    """from_branches' tree, and which branches became its leaves (their indices, in leaf order)."""
    tokens: list[int] = []
    parents: list[int] = []
    children: list[dict[int, int]] = [{}]
    leaves: list[int] = []
    kept: list[int] = []
    for index, branch in enumerate(branches):
        node, grew = 0, False
        for token in branch:
            child = children[node].get(token)
            if child is None:
                tokens.append(int(token))
                parents.append(node)
                children.append({})
                child = len(tokens)
                children[node][token] = child
                grew = True
            node = child
        if node and (grew or not leaves):
            leaves.append(node)
            kept.append(index)
    return DraftTree(tuple(tokens), tuple(parents), tuple(leaves)), kept


def spine_with_leaves(spine: Sequence[int], leaves: Sequence[tuple[int, int]]) -> DraftTree:
    """The spine plus single-token alternatives: (depth j, token) hangs beside spine token j."""
    branches = [list(spine)] + [list(spine[:depth - 1]) + [token] for depth, token in leaves]
    return from_branches(branches)


def walk(tree: DraftTree, next_tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """(path nodes, emitted tokens) given each node's next token (root first)."""
    kids = tree.children()
    node, path = 0, []
    while (child := kids[node].get(next_tokens[node])) is not None:
        path.append(child)
        node = child
    return path, [tree.tokens[n - 1] for n in path] + [next_tokens[node]]


def branch_accepted(tree: DraftTree, next_tokens: Sequence[int]) -> list[int]:
    """How many drafts each branch alone would have had accepted under the same draws."""
    out = []
    for leaf in tree.leaves:
        node, n = 0, 0
        for step in tree.path(leaf):
            if next_tokens[node] != tree.tokens[step - 1]:
                break
            node, n = step, n + 1
        out.append(n)
    return out


def winning_branch(tree: DraftTree, path: Sequence[int]) -> int:
    """The first branch whose path contains the walked path (0 when nothing was accepted)."""
    if not path:
        return 0
    for b, leaf in enumerate(tree.leaves):
        if path[-1] in tree.path(leaf):
            return b
    raise ValueError("the path is not in the tree")
