"""The prompt cache's policy (runtime/prompt_cache.py): lookups give the true longest usable shared
prefix within a scope, bounds always hold, eviction is least recently used, and counters add up."""

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.prompt_cache import PromptCacheIndex, cache_scope, shared_prefix

runs = st.lists(st.integers(0, 3), min_size=0, max_size=12).map(tuple)  # few symbols: many shared prefixes
scopes = st.sampled_from(["", "salt:a", "salt:b"])
ops = st.lists(st.tuples(st.sampled_from(["insert", "lookup"]), scopes, runs, st.integers(1, 40)), max_size=40)


def brute_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(a=runs, b=runs)
def test_shared_prefix_is_the_common_prefix(a, b):
    assert shared_prefix(a, b) == brute_prefix(a, b)


@settings(max_examples=300, deadline=None)
@given(ops=ops, max_entries=st.integers(1, 5), max_bytes=st.integers(1, 100))
def test_bounds_hold_and_lookups_give_the_longest_usable_prefix_in_scope(ops, max_entries, max_bytes):
    index = PromptCacheIndex(max_entries, max_bytes)
    for op, scope, tokens, nbytes in ops:
        if op == "insert":
            index.insert(scope, tokens, nbytes, payload=tokens)
        else:
            before = [(e.scope, e.tokens) for e in index.entries.values()]
            entry, reused = index.lookup(scope, tokens)
            best = max((min(brute_prefix(t, tokens), len(tokens) - 1) for s, t in before if s == scope), default=0)
            assert reused == max(best, 0)
            if entry is not None:
                assert entry.scope == scope and entry.tokens[:reused] == tokens[:reused] and reused < len(tokens)
                assert list(index.entries.values())[-1] is entry  # now the most recently used
            else:
                assert reused == 0
        assert len(index.entries) <= max_entries
        assert index.nbytes == sum(e.nbytes for e in index.entries.values()) <= max_bytes


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_the_least_recently_used_entry_is_the_one_evicted(ops):
    index = PromptCacheIndex(max_entries=3, max_bytes=10 ** 9)
    for op, scope, tokens, nbytes in ops:
        if op == "lookup":
            index.lookup(scope, tokens)
            continue
        order = list(index.entries.values())
        gone = index.insert(scope, tokens, nbytes, payload=None)
        evicted = [e for e in gone if not (e.scope == scope and tokens[:len(e.tokens)] == e.tokens)]
        survivors = [e for e in order if e not in gone]
        assert evicted == [e for e in order if e in evicted]  # oldest first
        if evicted:  # everything older than the evicted entries went too, bar superseded ones
            assert all(order.index(e) > order.index(evicted[-1]) for e in survivors)


@given(ops=ops)
def test_scopes_never_share(ops):
    index = PromptCacheIndex(8, 10 ** 9)
    for op, scope, tokens, nbytes in ops:
        if op == "insert":
            index.insert(scope, tokens, nbytes, payload=scope)
        else:
            entry, _ = index.lookup(scope, tokens)
            assert entry is None or entry.payload == scope


def test_superseded_covered_and_oversized_runs():
    index = PromptCacheIndex(4, 100)
    index.insert("", (1, 2, 3), 10, None)
    index.insert("", (1, 2, 3, 4, 5), 20, None)  # extends the first: it supersedes it
    assert [e.tokens for e in index.entries.values()] == [(1, 2, 3, 4, 5)] and index.nbytes == 20
    index.insert("", (1, 2), 5, None)  # covered already: nothing added
    assert len(index.entries) == 1
    index.insert("", (9,) * 4, 101, None)  # larger than the whole bound: not kept, nothing evicted
    assert len(index.entries) == 1 and index.stats.evictions == 0
    assert index.lookup("", (1, 2, 3, 4, 5)) [1] == 4  # the last token must run: never all of it
    assert index.peek("", (1, 2, 9)) == 2 and index.stats.queries == 1


def test_counters_add_up():
    index = PromptCacheIndex(2, 100)
    index.insert("", (1, 2, 3, 4), 10, None)
    index.lookup("", (1, 2, 7))
    index.lookup("", (5, 6))
    index.insert("", (5, 6, 7), 10, None)
    index.insert("", (8, 8, 8), 10, None)
    account = index.snapshot()
    assert (account["queries"], account["hits"], account["hit_tokens"], account["query_tokens"]) == (2, 1, 2, 5)
    assert (account["entries"], account["bytes"], account["evictions"], account["hit_rate"]) == (2, 20, 1, 0.5)


def test_a_scope_is_the_salt_and_whether_the_request_drafts():
    assert cache_scope(False, "a", True) is None
    assert len({cache_scope(True, None, True), cache_scope(True, None, False), cache_scope(True, "a", True),
                cache_scope(True, "", True)}) == 4
