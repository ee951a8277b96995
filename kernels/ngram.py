"""N-gram prompt lookup: draft by copying what followed the last n tokens earlier in the sequence.

No weights and no MLX. It runs every step over the prompt plus the output so far (a few thousand
tokens), so the search is done by `bytes.rfind` over a packed copy of the ids, in C, not by a
Python loop. Its drafts are deterministic (q is one-hot), which `acceptance.accept_drafts` takes
as `draft_probs=None`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

_WIDTH = array("I").itemsize  # bytes per token id once packed as unsigned ints


def propose_ngram(tokens: Sequence[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens.

    n is tried from max_n down to min_n (a longer match is better evidence); the first n with
    a match wins, and among its matches the most recent one. Returns [] when nothing matches.
    Fewer than k tokens come back when the match is near the end of the sequence.
    """
    length = len(tokens)
    if k <= 0 or min_n < 1 or length < 2:
        return []
    packed = array("I", tokens).tobytes()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        start = _last_earlier_match(packed, length, n)
        if start is not None:
            follow = start + n
            return [int(t) for t in tokens[follow : follow + k]]
    return []


def _last_earlier_match(packed: bytes, length: int, n: int) -> int | None:
    """Token index of the latest occurrence of the final n tokens that ends before the last token.

    Ending before the last token guarantees at least one token follows the match, and excludes
    the suffix matching itself.
    """
    pattern = packed[(length - n) * _WIDTH :]
    end = (length - 1) * _WIDTH
    while True:
        found = packed.rfind(pattern, 0, end)
        if found < 0:
            return None
        if found % _WIDTH == 0:
            return found // _WIDTH
        # A hit straddling token boundaries is no match; search again strictly before it.
        end = found + len(pattern) - 1
