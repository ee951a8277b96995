"""The prompt cache's policy, pure (no MLX, no asyncio): which cached token run a new prompt reuses,
and which entries go when the cache is over its bounds.

Entries are token runs (a finished request's prompt and output) with an opaque payload (its KV and
drafter state, kernels/prompt_store.py) and its size in bytes. A lookup reuses the entry sharing the
longest prefix with the prompt, within the prompt's scope (its cache_salt: scopes never share), and
at most all but the prompt's last token (that one must run to give the first output's logits): an
exact earlier prompt, a shorter prefix, or a longer entry cut back to the shared part. Bounds are on
entries and bytes; the least recently used entry goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


def cache_scope(cache_prompt: bool, salt: str | None, drafts: bool) -> str | None:
    """Which entries a request may share: those of its salt, kept by requests that draft as it does
    (one that never drafts keeps no drafter state); None when it opts out."""
    if not cache_prompt:
        return None
    return ("salt:" + salt if salt is not None else "") + ("|drafts" if drafts else "|plain")


@dataclass
class Entry:
    scope: str
    tokens: tuple[int, ...]
    nbytes: int
    payload: Any


@dataclass
class CacheStats:
    queries: int = 0  # lookups (requests that allowed the cache)
    hits: int = 0  # lookups that reused at least one token
    hit_tokens: int = 0  # prompt tokens reused, all told
    query_tokens: int = 0  # prompt tokens looked up, all told
    evictions: int = 0  # entries dropped to stay within the bounds
    inserts: int = 0


def shared_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix of two token runs (binary search over C-speed slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PromptCacheIndex:
    """LRU entries bounded by count and bytes; the most recently used entry is last."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries: OrderedDict[tuple[str, tuple[int, ...]], Entry] = OrderedDict()
        self.nbytes = 0
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def lookup(self, scope: str, prompt: tuple[int, ...]) -> tuple[Entry | None, int]:
        """(the entry to reuse, how many of the prompt's tokens it gives), or (None, 0)."""
        self.stats.queries += 1
        self.stats.query_tokens += len(prompt)
        best, reused = None, 0
        for entry in reversed(self.entries.values()):  # newest first: ties go to the fresher entry
            if entry.scope == scope:
                n = min(shared_prefix(entry.tokens, prompt), len(prompt) - 1)
                if n > reused:
                    best, reused = entry, n
        if best is None:
            return None, 0
        self.entries.move_to_end((best.scope, best.tokens))
        self.stats.hits += 1
        self.stats.hit_tokens += reused
        return best, reused

    def peek(self, scope: str, prompt: tuple[int, ...]) -> int:
        """How many of the prompt's tokens a lookup would reuse, counting and refreshing nothing."""
        best = max((shared_prefix(e.tokens, prompt) for e in self.entries.values() if e.scope == scope), default=0)
        return max(0, min(best, len(prompt) - 1))

    def covers(self, scope: str, tokens: tuple[int, ...]) -> bool:
        """Whether an entry holds this whole run already (it or a longer run starting with it)."""
        return any(e.scope == scope and e.tokens[:len(tokens)] == tokens for e in self.entries.values())

    def insert(self, scope: str, tokens: tuple[int, ...], nbytes: int, payload: Any) -> list[Entry]:
        """Add a run; entries it extends are superseded. Returns what left (superseded or evicted).
        A run already covered only refreshes the covering entry; one over the byte bound is not kept."""
        if not tokens or not self.enabled or nbytes > self.max_bytes:
            return []
        for entry in reversed(self.entries.values()):
            if entry.scope == scope and entry.tokens[:len(tokens)] == tokens:
                self.entries.move_to_end((entry.scope, entry.tokens))
                return []
        gone = [e for e in self.entries.values() if e.scope == scope and tokens[:len(e.tokens)] == e.tokens]
        for entry in gone:
            self._drop(entry)
        self.entries[(scope, tokens)] = Entry(scope, tokens, nbytes, payload)
        self.nbytes += nbytes
        self.stats.inserts += 1
        while len(self.entries) > self.max_entries or self.nbytes > self.max_bytes:
            oldest = next(iter(self.entries.values()))
            self._drop(oldest)
            self.stats.evictions += 1
            gone.append(oldest)
        return gone

    def _drop(self, entry: Entry) -> None:
        del self.entries[(entry.scope, entry.tokens)]
        self.nbytes -= entry.nbytes

    def snapshot(self) -> dict:
        s = self.stats
        return {"enabled": self.enabled, "entries": len(self.entries), "bytes": self.nbytes,
                "max_entries": self.max_entries, "max_bytes": self.max_bytes, "queries": s.queries,
                "hits": s.hits, "hit_tokens": s.hit_tokens, "query_tokens": s.query_tokens,
                "evictions": s.evictions, "hit_rate": round(s.hits / s.queries, 4) if s.queries else 0.0}
