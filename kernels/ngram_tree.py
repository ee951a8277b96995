"""N-gram prompt lookup with alternatives: several continuations where the last n tokens occurred
more than once earlier with different followers.

Branch 0 is exactly kernels/ngram.py's proposal (the longest n with a match, its most recent
occurrence), so a tree of one branch is the chain. Further branches come from older occurrences of
the same n-gram, then from shorter n-grams, newest first, each kept only if it begins differently
from every branch before it at some position (a duplicate adds nothing to a tree). No MLX.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from kernels.ngram import propose_ngram

_WIDTH = array("I").itemsize


def propose_ngram_branches(tokens: Sequence[int], k: int, width: int, max_n: int = 3,
                           min_n: int = 1, scan: int = 64) -> list[list[int]]:
    """Up to `width` distinct continuations of up to k tokens; [] when nothing matches. At most
    `scan` earlier occurrences are looked at, so a long repetitive history costs a bounded search."""
    first = propose_ngram(tokens, k, max_n=max_n, min_n=min_n)
    if not first or width <= 1:
        return [first] if first else []
    branches, seen = [first], {tuple(first)}
    packed, length = array("I", tokens).tobytes(), len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        for start in _occurrences(packed, length, n, scan):
            follow = [int(t) for t in tokens[start + n:start + n + k]]
            if follow and not _covered(follow, seen):
                branches.append(follow)
                seen.add(tuple(follow))
                if len(branches) == width:
                    return branches
    return branches


def _covered(follow: list[int], seen: set[tuple[int, ...]]) -> bool:
    """Whether some branch already holds this continuation (or it is a prefix of one)."""
    return any(s[:len(follow)] == tuple(follow) for s in seen)


def _occurrences(packed: bytes, length: int, n: int, limit: int):
    """Token indices of earlier occurrences of the final n tokens, newest first (as ngram.py's
    match: ending before the last token, aligned to token boundaries)."""
    pattern = packed[(length - n) * _WIDTH:]
    end = (length - 1) * _WIDTH
    found_count = 0
    while found_count < limit:
        found = packed.rfind(pattern, 0, end)
        if found < 0:
            return
        if found % _WIDTH == 0:
            found_count += 1
            yield found // _WIDTH
        end = found + len(pattern) - 1  # next, strictly before this start
