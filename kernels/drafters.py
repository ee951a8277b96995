"""Model-side drafters, run by the engine on the owner thread: an MTP head and a draft model.

Both keep their own KV cache in step with the target's committed tokens. The engine calls:
fed(state, tokens, hidden) for every plain or prefill forward of the target (hidden: the features
kernels/features.body gives for the drafter's `feature_layers`); undo_feed(state) when a
lookahead step is dropped; behind(state) -> how many tokens fed that way the next propose must catch
up on (0 in a run of speculative steps); propose(state, k) -> (ids, confidences, q or None);
verified(state, hidden) after a verify forward; commit(state, drafted, accepted, emitted) after acceptance. The MTP head
also drafts trees: propose_tree(state, k, top) -> (spine, confidences, top candidates per depth).
For the prompt cache (kernels/prompt_store.py): snapshot(state, n) -> the state for the first n
committed tokens, owned; restore(state, snapshot, tokens, m) -> a new sequence's state for the
first m <= n of them, exactly as if it had been fed those m tokens. For a prefill twin
(kernels/batch_prefill.py): clone(source, twin) -> twin's state a copy of source's, its caches owned.
(N-gram lookup needs no model and runs in the drafter actor itself.)
"""

from __future__ import annotations

from typing import NamedTuple

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from kernels.compiled_blocks import MAX_ROWS
from kernels.features import check_layers
from kernels.loader import output_head
from kernels.mtp_draft_many import DraftJob, batchable, draft_many
from kernels.mtp_head import MTPHead
from kernels.prompt_store import copy_layers, layers_nbytes, restored_cache
from kernels.sampling import greedy, probs_from_logits, sample, top1_logprob

# Exact pairs wait for the next propose, which feeds them to the head in its first forward (absorbing
# those beyond the compiled block first, so the draft's own forward stays compiled). A sequence that
# does not draft keeps only its newest pairs: at _ABSORB_AFTER pending, a plain step forgets the
# oldest, down to _KEEP. Absorbing them instead kept the head in step at ~0.13 ms a pair per sequence
# (its block is compute-bound at 63 rows: 7-10 ms an absorb on a 2-core Xeon), 3-4% of a batch's
# plain decode where nothing drafted; a head that drafts after forgetting reads only the newest 47-63
# pairs, which cost 2-3% of its first-draft acceptance even when every draft did so (held-out chat
# 0.362 -> 0.353, code 0.567 -> 0.556, a replay of the shipped head). A prompt's chunks still absorb
# what came before them, so a cached prompt restores the state a fresh prefill leaves.
_ABSORB_AFTER = 4 * MAX_ROWS - 1
_KEEP = 3 * MAX_ROWS - 1


class MtpDrafter:
    """Per sequence: `hidden`/`tokens`, the `pending` exact pairs (target hidden h_j, token t_j+1)
    not yet in the head's cache, `unpaired`, the newest hidden row, whose next token is the
    sequence's `last`, and `exact`, how many of the head cache's first rows are pairs 0.. in order
    (None until a pair is forgotten: then all of them)."""

    wants_hidden = True
    clonable = True  # its head caches are plain KV caches
    keep_log = False  # the prompt cache sets it: every pair's hidden row stays, in d["log"]

    def __init__(self, head: MTPHead, target):
        check_layers(target, head.config.feature_layers)
        self.head, self.target = head, target
        self.feature_layers = head.config.feature_layers  # the target's layers fed with its hidden state
        inner = target.model
        self.embed, self.norm = inner.embed_tokens, inner.norm
        self.lm_head = output_head(target)

    def _own(self, state) -> dict:
        if not state.drafter:
            state.drafter.update(cache=self.head.make_cache(), hidden=[], tokens=[], pending=0, unpaired=None,
                                 undo=None, log=[], behind=0, exact=None)
        return state.drafter

    def fed(self, state, tokens: mx.array, hidden: mx.array) -> None:
        d = self._own(state)
        if d["pending"] >= _ABSORB_AFTER:  # pairs fed before: this feed stays undoable
            if tokens.shape[0] == 1 and d["pending"] > _KEEP:  # a plain step: the newest pairs are kept
                self._forget(d, d["pending"] - _KEEP)
            else:  # a prompt chunk: the pairs before it stay exact, as a restore makes them
                self._absorb(d)
        d["undo"] = (len(d["hidden"]), d["pending"], d["unpaired"], len(d["log"]), d["behind"])
        if d["unpaired"] is not None:
            self._add(d, d["unpaired"], tokens if tokens.shape[0] == 1 else tokens[:1])
        if tokens.shape[0] > 1:
            self._add(d, hidden[:-1], tokens[1:])
        d["unpaired"] = hidden if hidden.shape[0] == 1 else hidden[-1:]
        d["behind"] += tokens.shape[0]

    def undo_feed(self, state) -> None:
        d = self._own(state)
        if d["undo"] is not None:
            count, d["pending"], d["unpaired"], logged, d["behind"] = d["undo"]
            del d["hidden"][count:], d["tokens"][count:], d["log"][logged:]
            d["undo"] = None

    def behind(self, state) -> int:
        return self._own(state)["behind"]

    def propose(self, state, k: int):
        d = self._own(state)
        h, t = self._pairs_to_draft_from(state, d)
        key = state.next_key() if state.temperature > 0 else None
        out = self.head.draft(h, t, k, self.embed, self.norm, self.lm_head, d["cache"],
                              temperature=state.temperature, top_p=state.top_p, key=key)
        return out.ids, out.logprobs, out.probs

    def propose_many(self, states: list, ks: list[int]) -> list[tuple]:
        """propose for several sequences, their head forwards batched (kernels/mtp_draft_many.py):
        the head's weights are read once per depth, not once per sequence."""
        if len(states) < 2 or not batchable(self.head):
            return [self.propose(state, k) for state, k in zip(states, ks)]
        jobs = []
        for state, k in zip(states, ks):
            d = self._own(state)
            h, t = self._pairs_to_draft_from(state, d)
            key = state.next_key() if state.temperature > 0 else None
            jobs.append(DraftJob(h, t, k, d["cache"], state.temperature, state.top_p, key))
        drafts = draft_many(self.head, jobs, self.embed, self.norm, self.lm_head)
        return [(out.ids, out.logprobs, out.probs) for out in drafts]

    def propose_tree(self, state, k: int, top: int):
        """The greedy chain of propose (the spine, at any temperature: tree drafts are deterministic)
        and, at each depth, the head's next `top` candidates with their probabilities."""
        d = self._own(state)
        h, t = self._pairs_to_draft_from(state, d)
        head, cache = self.head, d["cache"]
        x = head.forward(h.reshape(1, -1, h.shape[-1]), t.astype(mx.int32).reshape(1, -1), self.embed, self.norm,
                         cache)[:, -1:, :]
        ids, logprobs, tops = [], [], []
        for depth in range(k):  # as MTPHead.draft at temperature 0, plus the candidates
            logits = head.draft_logits(x, self.lm_head)[0, 0]
            logprobs.append(top1_logprob(logits))
            ids.append(_full(head, greedy(logits)))
            probs = mx.softmax(logits.astype(mx.float32))
            order = mx.argpartition(-probs, kth=top)[:top + 1]  # the top + 1 likeliest, unordered
            tops.append((_full(head, order), probs[order]))
            if depth + 1 < k:
                x = head.forward(x, ids[-1].reshape(1, 1), self.embed, self.norm, cache, exact=False)
        for layer_cache in cache:
            layer_cache.trim(k - 1)
        ids_array, logprob_array = mx.stack(ids), mx.stack(logprobs)
        top_ids, top_probs = mx.stack([i for i, _ in tops]), mx.stack([p for _, p in tops])
        mx.eval(ids_array, logprob_array, top_ids, top_probs)
        spine = ids_array.tolist()
        alternatives = [sorted(((i, p) for i, p in zip(row_ids, row_probs) if i != spine[depth]),
                               key=lambda c: -c[1])[:top]
                        for depth, (row_ids, row_probs) in enumerate(zip(top_ids.tolist(), top_probs.tolist()))]
        return spine, logprob_array.tolist(), alternatives

    def _pairs_to_draft_from(self, state, d: dict) -> tuple[mx.array, mx.array]:
        """Every pending pair and the newest (h of last, last): a draft's first forward takes them all,
        so the head is caught up and nothing is left to undo."""
        if d["pending"] >= MAX_ROWS:
            self._absorb(d)
        self._add(d, d["unpaired"], state.last.astype(mx.uint32).reshape(1))
        h, t = self._take_pairs(d)
        d["unpaired"] = d["undo"] = None
        d["behind"] = 0
        return h, t

    def verified(self, state, hidden: mx.array) -> None:
        self._own(state)["verify_hidden"] = hidden

    def commit(self, state, drafted: int, accepted: int, emitted: list[int]) -> None:
        d = self._own(state)
        hidden = d.pop("verify_hidden")
        if d["unpaired"] is not None:  # verified without a propose (a grammar's forced drafts)
            self._add(d, d["unpaired"], state.last.astype(mx.uint32).reshape(1))
        if accepted:  # (h of last, d_1), ..., (h of d_n-1, d_n): exact pairs
            self._add(d, hidden[:accepted], mx.array(emitted[:accepted], dtype=mx.uint32))
        d["unpaired"] = hidden[accepted:accepted + 1]  # its next token is the new last, emitted[-1]

    @staticmethod
    def _forget(d: dict, rows: int) -> None:
        """Drop the oldest `rows` pending pairs (the log keeps them for the prompt cache): the next
        propose catches up on the rest and the newest."""
        if d["exact"] is None:
            d["exact"] = d["cache"][0].offset
        d["behind"] = min(d["behind"], d["pending"] - rows + 1)
        while rows > 0:
            first = d["tokens"][0].shape[0]
            if first > rows:
                d["hidden"][0], d["tokens"][0] = d["hidden"][0][rows:], d["tokens"][0][rows:]
                d["pending"] -= rows
                return
            del d["hidden"][0], d["tokens"][0]
            d["pending"] -= first
            rows -= first

    def _absorb(self, d: dict) -> None:
        h, t = self._take_pairs(d)
        self.head.absorb(h, t, self.embed, self.norm, d["cache"])

    def snapshot(self, state, n: int) -> "MtpSnapshot | None":
        """The head's cache for pairs 0..n-2 (those absorbed) and the hidden rows h_0..h_n-1."""
        d = self._own(state)
        if d["unpaired"] is None:  # drafted and not yet committed: not a state of committed tokens
            return None
        rows = mx.concatenate([*d["log"], d["unpaired"]])[:n]
        exact = d["cache"][0].offset if d["exact"] is None else d["exact"]
        absorbed = min(exact, n - 1)
        head = copy_layers([(c.keys, c.values) for c in d["cache"]], 0, absorbed) if absorbed else ()
        hidden = mx.contiguous(rows)
        mx.eval(hidden)
        return MtpSnapshot(head, absorbed, hidden, layers_nbytes(head) + hidden.nbytes)

    def restore(self, state, snap: "MtpSnapshot", tokens: tuple[int, ...], m: int) -> None:
        """As if fed tokens[:m]: pairs 0..m-2 (the absorbed ones in the head's cache, the rest
        pending) and h_m-1 unpaired, its next token the new prompt's m-th."""
        d = self._own(state)
        kept = min(snap.absorbed, m - 1)
        if kept:
            d["cache"] = restored_cache(snap.head, kept)
        if m - 1 > kept:
            self._add(d, snap.hidden[kept:m - 1], mx.array(tokens[kept + 1:m], dtype=mx.uint32))
        d["log"], d["packed"] = ([snap.hidden[:m - 1]], 1) if self.keep_log else ([], 0)
        d["unpaired"], d["undo"], d["behind"] = snap.hidden[m - 1:m], None, m - kept

    def clone(self, source, twin) -> None:
        d = dict(self._own(source))
        d["cache"] = owned_caches(d["cache"], self.head.make_cache)
        for name in ("hidden", "tokens", "log"):  # lists of immutable arrays: new lists, shared rows
            d[name] = list(d[name])
        twin.drafter.clear()
        twin.drafter.update(d)

    def _add(self, d: dict, hidden: mx.array, tokens: mx.array) -> None:
        if self.keep_log:
            d["log"].append(hidden)
        d["hidden"].append(hidden)
        d["tokens"].append(tokens)
        d["pending"] += tokens.shape[0]

    @staticmethod
    def _pack_log(d: dict) -> None:
        """Copy the newest logged rows into one block: they are views into step-wide buffers (a batch
        step's hidden rows of every sequence), which would otherwise stay alive with them."""
        packed = d.get("packed", 0)
        if len(d["log"]) - packed >= 32:
            block = mx.concatenate(d["log"][packed:])
            mx.async_eval(block)
            d["log"][packed:] = [block]
            d["packed"] = packed + 1

    def _take_pairs(self, d: dict) -> tuple[mx.array, mx.array]:
        if self.keep_log:  # no feed is undoable here, so the log's layout may change
            self._pack_log(d)
        h, t = mx.concatenate(d["hidden"]), mx.concatenate(d["tokens"])
        d["hidden"], d["tokens"], d["pending"] = [], [], 0
        return h, t


def _full(head: MTPHead, ids: mx.array) -> mx.array:
    """Draft-vocabulary ids as the target's (a reduced head maps them back)."""
    return head.vocab_map[ids] if head.reduced else ids


def owned_caches(caches: list, fresh) -> list:
    """Copies of KV caches that share no buffer a later write could reach (fresh() when empty)."""
    n = caches[0].offset if caches else 0
    return restored_cache(copy_layers([(c.keys, c.values) for c in caches], 0, n), n) if n else fresh()


class MtpSnapshot(NamedTuple):
    head: tuple  # the head cache's layers for its first `absorbed` pairs (kernels/prompt_store.Layers)
    absorbed: int
    hidden: mx.array  # [n, hidden]: the target's hidden row of each of the n tokens
    nbytes: int


class DraftSnapshot(NamedTuple):
    kv: tuple  # the draft model's cache for the first `fed` tokens
    fed: int
    nbytes: int


class DraftModelDrafter:
    """Per sequence: the draft model's cache, and `unfed`, committed tokens it has not seen yet
    (the sequence's `last` excluded: it is added at propose time)."""

    wants_hidden = False
    feature_layers = ()

    def __init__(self, model):
        from kernels.prompt_store import supports

        self.model = model
        self.clonable = supports(make_prompt_cache(model))  # rotating or quantized caches are not copied

    def _own(self, state) -> dict:
        if not state.drafter:
            state.drafter.update(cache=make_prompt_cache(self.model), unfed=[], fed_last=0)
        return state.drafter

    def snapshot(self, state, n: int) -> DraftSnapshot:
        """The draft model's cache for the tokens it has seen of the first n (the rest were unfed)."""
        d = self._own(state)
        fed = min(d["cache"][0].offset, n)
        kv = copy_layers([(c.keys, c.values) for c in d["cache"]], 0, fed) if fed else ()
        return DraftSnapshot(kv, fed, layers_nbytes(kv))

    def restore(self, state, snap: DraftSnapshot, tokens: tuple[int, ...], m: int) -> None:
        d = self._own(state)
        fed = min(snap.fed, m)
        if fed:
            d["cache"] = restored_cache(snap.kv, fed)
        d["unfed"] = [mx.array(tokens[fed:m], dtype=mx.uint32)] if m > fed else []
        d["fed_last"] = 0

    def clone(self, source, twin) -> None:
        d = dict(self._own(source))
        d["cache"] = owned_caches(d["cache"], lambda: make_prompt_cache(self.model))
        d["unfed"] = list(d["unfed"])
        twin.drafter.clear()
        twin.drafter.update(d)

    def fed(self, state, tokens: mx.array, hidden=None) -> None:
        d = self._own(state)
        d["unfed"].append(tokens)
        d["fed_last"] = tokens.shape[0]

    def undo_feed(self, state) -> None:
        d = self._own(state)
        if d["unfed"] and d["fed_last"]:
            d["unfed"].pop()
            d["fed_last"] = 0

    def behind(self, state) -> int:
        return sum(t.shape[0] for t in self._own(state)["unfed"])

    def propose(self, state, k: int):
        d = self._own(state)
        tokens = mx.concatenate([*d["unfed"], state.last.astype(mx.uint32).reshape(1)])
        d["unfed"], d["fed_last"], d["proposed"] = [], 0, k
        ids, logprobs, probs = [], [], []
        for depth in range(k):
            logits = self.model(tokens[None], cache=d["cache"])[0, -1]
            logprobs.append(top1_logprob(logits))
            if state.temperature > 0:
                probs.append(probs_from_logits(logits, state.temperature, state.top_p))
                ids.append(sample(probs[-1], state.next_key()))
            else:
                ids.append(greedy(logits))
            tokens = ids[-1].astype(mx.uint32).reshape(1)
        # The cache now holds d_1..d_k-1 beyond the committed tokens; commit trims what is rejected.
        q = mx.stack(probs) if probs else None
        ids_array, logprob_array = mx.stack(ids), mx.stack(logprobs)
        mx.eval(ids_array, logprob_array, *([q] if q is not None else []))
        return ids_array.tolist(), logprob_array.tolist(), q

    def verified(self, state, hidden) -> None:
        pass

    def commit(self, state, drafted: int, accepted: int, emitted: list[int]) -> None:
        # The cache holds d_1..d_k-1 of the k proposed, whatever fewer the planner had verified.
        d = self._own(state)
        if "proposed" not in d:  # verified without a propose (forced drafts): it saw none of the step
            seen = [state.last.astype(mx.uint32).reshape(1)] + ([mx.array(emitted[:-1], dtype=mx.uint32)]
                                                                 if emitted[:-1] else [])
            d["unfed"], d["fed_last"] = d["unfed"] + seen, 0
            return
        proposed = d.pop("proposed", drafted)
        keep = min(accepted, proposed - 1)
        for c in d["cache"]:
            c.trim(proposed - 1 - keep)
        # Committed but unseen: d_k when every draft was accepted (never fed to the draft model).
        d["unfed"] = [mx.array(emitted[keep:-1], dtype=mx.uint32)] if emitted[keep:-1] else []
        d["fed_last"] = 0
