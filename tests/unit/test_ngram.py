"""N-gram prompt lookup: edge cases, agreement with a plain reference, and speed."""

from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.ngram import propose_ngram


def reference_ngram(tokens, k, max_n=3, min_n=1):
    """The obvious quadratic version: longest n first, latest earlier match wins."""
    tokens = list(tokens)
    if k <= 0 or min_n < 1:
        return []
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_no_match_proposes_nothing():
    assert propose_ngram([1, 2, 3, 4], 3) == []


def test_too_short_or_k_zero_proposes_nothing():
    assert propose_ngram([], 3) == []
    assert propose_ngram([7], 3) == []
    assert propose_ngram([1, 2, 1], 0) == []


def test_copies_what_followed_the_match():
    assert propose_ngram([10, 11, 12, 13, 14, 9, 10, 11, 12], 2) == [13, 14]


def test_match_right_before_the_suffix_continues_into_it():
    # The only earlier "5" is the token before the last one: what follows it is the last token.
    assert propose_ngram([1, 5, 5], 4) == [5]


def test_k_larger_than_what_follows_returns_fewer():
    assert propose_ngram([1, 2, 3, 1, 2], 10) == [3, 1, 2]
    assert propose_ngram([1, 2, 1, 2, 1, 2], 4) == [1, 2]


def test_longest_n_wins_over_a_more_recent_shorter_match():
    tokens = [7, 8, 9, 40, 41, 9, 50, 7, 8, 9]
    # "9" alone last occurred before 50; "7 8 9" occurred before 40 41.
    assert propose_ngram(tokens, 2) == [40, 41]
    assert propose_ngram(tokens, 2, max_n=1) == [50, 7]


def test_most_recent_match_wins():
    assert propose_ngram([3, 1, 3, 2, 3], 1, max_n=1) == [2]


def test_min_n_rules_out_short_matches():
    tokens = [4, 9, 1, 2, 9]
    assert propose_ngram(tokens, 1, max_n=3, min_n=1) == [1]
    assert propose_ngram(tokens, 1, max_n=3, min_n=2) == []


def test_byte_patterns_across_token_boundaries_are_not_matches():
    # Packed little-endian, 256 then 0 contains the bytes of token 1 at an odd offset.
    assert propose_ngram([256, 0, 5, 1], 2) == []
    assert propose_ngram([1, 7, 256, 0, 9, 1], 2) == [7, 256]


def test_accepts_tuples_and_large_ids():
    assert propose_ngram((150_000, 2, 150_000), 3) == [2, 150_000]


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.sampled_from([0, 1, 2, 3, 256, 65_536, 16_777_216]), max_size=40),
    k=st.integers(0, 6),
    max_n=st.integers(1, 4),
    min_n=st.integers(1, 3),
)
def test_agrees_with_the_reference(tokens, k, max_n, min_n):
    assert propose_ngram(tokens, k, max_n, min_n) == reference_ngram(tokens, k, max_n, min_n)


def test_fast_on_a_few_thousand_tokens():
    rng = random.Random(0)
    tokens = [rng.randrange(49_152) for _ in range(4000)]
    start = time.perf_counter()
    for _ in range(200):
        propose_ngram(tokens, 8)
    per_call = (time.perf_counter() - start) / 200
    assert per_call < 2e-3, f"{per_call * 1e3:.2f} ms per call"
