"""Forward passes for the model owner: prefill, plain decode with one step of lookahead, and the
speculative step (draft, verify, roll back).

Mirrors mlx-lm's generate loop (prompt[:-1] prefilled in chunks, then a step on the last token,
greedy = argmax of log-probabilities) so greedy output is byte-identical to it.
Per sequence, the KV cache holds every committed token except `last`, the input of the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from kernels.acceptance import accept_drafts, accept_greedy
from kernels.features import body
from kernels.loader import output_head
from kernels.processing import Processor, ProcessSpec, blocks_lookahead, commit, make_processor, note, processed
from kernels.sampling import greedy_ids, probs_from_logits, sample


@dataclass
class SeqState:
    cache: list
    temperature: float
    top_p: float
    key: mx.array | None
    last: mx.array | None = None  # the last emitted token, input of the next step
    pending: mx.array | None = None  # the next token, built ahead (lookahead)
    pending_started: bool = False  # ... and computing
    length: int = 0  # tokens in the KV cache
    drafter: dict = field(default_factory=dict)  # the drafter's own per-sequence state
    draft_probs: mx.array | None = None  # q of the last drafts (sampled drafting only)
    pending_trim: int = 0  # entries a batch-resident sequence sheds at the batch's next sync
    drafts: bool = True  # False (disable_mtp): never drafts, so the drafter is never fed either
    scope: str | None = None  # its prompt-cache scope (salt, drafting); None: it neither reuses nor is kept
    cached: int = 0  # prompt tokens the prompt cache gave it
    proc: Processor | None = None  # penalties and log-probabilities asked for; None: neither
    step_logits: mx.array | None = None  # the processed logits of the latest plain step (log-probabilities)
    pending_logits: mx.array | None = None  # ... of the lookahead step in flight
    caught_up: int = 0  # tokens the latest propose caught up on (fed by plain steps or prefill since the one before)

    def next_key(self) -> mx.array:
        self.key, sub = mx.random.split(self.key)
        return sub


class Engine:
    def __init__(self, model, prefill_step: int = 2048, drafter=None, batched: bool = False, prompt_cache=None):
        from kernels.batch_engine import Batch
        from kernels.prompt_store import supports

        self.model = model
        self.prefill_step = prefill_step
        self.drafter = drafter  # a kernels.drafters drafter that runs on this thread, or None
        self.seqs: dict[str, SeqState] = {}
        self.specs: dict[str, ProcessSpec] = {}  # set by the owner before a sequence's prefill
        # mtp_batch: decoding sequences live in one batch cache; serial keeps one cache per sequence
        self.batch = Batch() if batched else None
        # A kernels.prompt_store.PromptStore, or None (off, or a model whose caches it cannot copy)
        copyable = supports(make_prompt_cache(model))
        self.prompt_cache = prompt_cache if prompt_cache is not None and copyable else None
        # prefill twins (kernels/batch_prefill.py) copy KV and drafter caches: plain KV caches only
        self.can_twin = copyable and getattr(drafter, "clonable", True)
        if self.prompt_cache is not None and drafter is not None:
            drafter.keep_log = True
        self.progress = _nothing  # called after each prefill chunk (a distributed group's watchdog)

    # --- plain path --------------------------------------------------------------------------
    def prefill(self, seq_id: str, prompt_ids, temperature: float, top_p: float,
                seed: int | None, lookahead: bool, drafts: bool = True, scope: str | None = None) -> int:
        from kernels.prompt_store import reuse

        key = None if temperature == 0 else mx.random.key(seed if seed is not None else _fresh_seed())
        state = SeqState(make_prompt_cache(self.model), temperature, top_p, key, drafts=drafts, scope=scope,
                         proc=self.processor(seq_id, prompt_ids))
        self.seqs[seq_id] = state
        prompt = mx.array(prompt_ids, dtype=mx.uint32)
        done = reuse(self, state, prompt_ids)  # the cached prefix is in state.cache already
        while len(prompt_ids) - done > 1:
            n = min(self.prefill_step, len(prompt_ids) - done - 1)
            self._forward(state, prompt[done:done + n])
            mx.eval([c.state for c in state.cache])
            done += n
            self.progress()
        token = self._emit(state, self._step(state, prompt[done:]))
        if lookahead and self.batch is None:
            self.start_ahead([seq_id])
        return token

    def prefill_chunk(self, items, budget: int | None) -> tuple[dict[str, int] | None, int]:
        """mtp_batch chunked prefill: start a group (items: (seq_id, prompt_ids, temperature, top_p,
        seed, drafts, scope)) or, with no items, go on with the one in flight, running at most `budget`
        padded tokens (None: the rest). Returns each sequence's first token once the group is done
        (else None) and the padded tokens run. Newcomers with a cached prefix prefill their rest
        alone at once (their first tokens come back now) and join the batch with their own cache."""
        from kernels.batch_prefill import PrefillGroup, advance

        hits, items = self._cache_hits(items)
        try:
            firsts_now = {item[0]: self.prefill(*item[:5], lookahead=False, drafts=item[5], scope=item[6])
                          for item in hits}
        except BaseException:  # the scheduler fails every sequence of the chunk
            for item in hits:
                self.seqs.pop(item[0], None)
            raise
        hit_tokens = sum(len(item[1]) - self.seqs[item[0]].cached for item in hits)
        if items:
            self.batch.prefilling = PrefillGroup(self, items)
        group = self.batch.prefilling
        if group is None:
            return firsts_now, hit_tokens
        try:
            firsts, spent = advance(self, group, budget)
        except BaseException:
            self.batch.prefilling = None  # the scheduler fails the group's sequences
            for seq_id in group.all_ids:
                self.seqs.pop(seq_id, None)
            raise
        if firsts is None:
            return firsts_now or None, spent + hit_tokens
        self.batch.prefilling = None
        return {**firsts_now, **dict(zip(group.all_ids, firsts))}, spent + hit_tokens

    def _cache_hits(self, items) -> tuple[list, list]:
        """(newcomers whose prompt shares a cached prefix, the rest)."""
        if self.prompt_cache is None or not items:
            return [], list(items)
        hits = [i for i in items if len(i) > 6 and i[6] is not None and self.prompt_cache.peek(i[6], i[1]) > 0]
        return hits, [i for i in items if i not in hits]

    def decode(self, seq_ids, lookahead, launch: bool = True) -> list[int]:
        """One plain step of these sequences. Those with lookahead get their next plain step built
        too, and started unless launch is False (the model owner starts it after replying: see
        start_ahead)."""
        ahead = [s for s, wanted in zip(seq_ids, lookahead) if wanted]
        if self.batch is not None:  # one forward over every sequence
            from kernels.batch_engine import plain_rows

            return plain_rows(self, list(seq_ids), ahead, launch)
        out = []
        for seq_id in seq_ids:
            state = self.seqs[seq_id]
            y, state.pending = state.pending, None
            if y is not None:
                state.step_logits = state.pending_logits
            out.append(self._emit(state, self._step(state, state.last) if y is None else y))
        self.build_ahead(ahead)
        if launch:
            self.start_ahead(ahead)
        return out

    def build_ahead(self, seq_ids) -> None:
        """Build the next plain step of these sequences without starting it (the serial path)."""
        for seq_id in seq_ids:
            state = self.seqs.get(seq_id)
            if state is not None and state.pending is None and not blocks_lookahead(state):
                state.pending = self._step(state, state.last)
                state.pending_logits = state.step_logits
                state.pending_started = False

    def start_ahead(self, seq_ids) -> None:
        """Start the next plain step of these sequences (after a plain step or a verify), so it computes
        while the scheduler streams this step's tokens; the next decode takes it, a draft drops it.
        MLX's CPU async_eval runs most of a forward before it returns (it lets only a few ops queue
        ahead), so the model owner calls this after replying, not before reading the token. Building
        the step is Python, though, and the owner does that before replying (decode with launch
        False): built after, it waited on the GIL for the scheduler's own Python after the reply,
        and every step paid both (drafting requests' plain steps ~8% dearer than plain ones')."""
        if self.batch is not None:
            from kernels.batch_engine import start_ahead

            return start_ahead(self, list(seq_ids))
        self.build_ahead(seq_ids)
        for seq_id in seq_ids:
            state = self.seqs.get(seq_id)
            if state is not None and state.pending is not None and not state.pending_started:
                mx.async_eval(state.pending)
                state.pending_started = True

    def drafter_of(self, state: SeqState):
        """The drafter that follows this sequence, or None: one that never drafts is not fed."""
        return self.drafter if state.drafts else None

    def release(self, seq_id: str, tokens: tuple[int, ...] = ()) -> None:
        """Drop a sequence; with its committed tokens (prompt and output), the prompt cache keeps it."""
        from kernels.prompt_store import keep

        state = self.seqs.get(seq_id)
        if state is not None and tokens:
            keep(self, seq_id, state, tokens)
        self.seqs.pop(seq_id, None)
        self.specs.pop(seq_id, None)

    def processor(self, seq_id: str, prompt_ids) -> Processor | None:
        return make_processor(self.specs.pop(seq_id, None), prompt_ids)

    def take_logprobs(self, seq_id: str) -> tuple:
        """The log-probabilities of the tokens this sequence emitted since the last call."""
        state = self.seqs.get(seq_id)
        return () if state is None or state.proc is None else tuple(state.proc.take_logprobs())

    def close(self) -> None:
        """Finish work still in flight (lookahead steps) and drop every sequence. Exiting with MLX
        work running aborts the process ("terminate called without an active exception")."""
        self.seqs.clear()
        mx.synchronize()

    def _emit(self, state: SeqState, y: mx.array) -> int:
        state.last = y
        commit(state, y)
        token = y.item()
        if state.step_logits is not None:
            note(state, state.step_logits, [token])
        return token

    def _forward(self, state: SeqState, tokens: mx.array, verifying: bool = False) -> mx.array:
        """Logits [L, V] for tokens [L], appended to the cache; the drafter sees what is committed."""
        state.length += tokens.shape[0]
        drafter = self.drafter_of(state)
        if drafter is None or not drafter.wants_hidden:
            logits = self.model(tokens[None], cache=state.cache)[0]
            hidden = None
        else:
            final, features = body(self.model, tokens[None], state.cache, drafter.feature_layers)
            logits, hidden = output_head(self.model)(final[0]), features[0]
        if drafter is not None:
            drafter.verified(state, hidden) if verifying else drafter.fed(state, tokens, hidden)
        return logits

    def _step(self, state: SeqState, tokens: mx.array) -> mx.array:
        logits = processed(state, self._forward(state, tokens)[-1:])
        state.step_logits = logits if state.proc is not None else None
        if state.temperature == 0:
            return greedy_ids(logits)
        return sample(probs_from_logits(logits[0], state.temperature, state.top_p), state.next_key()).reshape(1)

    # --- speculative path --------------------------------------------------------------------
    def settle(self, state: SeqState) -> None:
        """Drop a lookahead step in flight: its cache entry goes, `last` stays the next input."""
        if state.pending is not None:
            state.pending = None
            self._trim(state, 1)
            if (drafter := self.drafter_of(state)) is not None:
                drafter.undo_feed(state)

    def propose(self, seq_id: str, k: int) -> tuple[list[int], list[float]]:
        """Drafts from the model-side drafter (MTP head or draft model) and their confidences."""
        state = self.seqs[seq_id]
        if not state.drafts:
            raise ValueError(f"sequence {seq_id} was prefilled as one that never drafts (disable_mtp)")
        self.settle(state)
        state.caught_up = self.drafter.behind(state)
        ids, confidences, state.draft_probs = self.drafter.propose(state, k)
        return ids, confidences

    def propose_many(self, items: list[tuple[str, int]]) -> list[tuple[list[int], list[float]]]:
        """propose for several sequences (seq_id, k) at once: a drafter that can batches their forwards."""
        states = [self.seqs[seq_id] for seq_id, _ in items]
        if not hasattr(self.drafter, "propose_many") or any(not s.drafts for s in states):
            return [self.propose(seq_id, k) for seq_id, k in items]
        for state in states:
            self.settle(state)
            state.caught_up = self.drafter.behind(state)
        out = []
        for state, (ids, confidences, probs) in zip(states, self.drafter.propose_many(states, [k for _, k in items])):
            state.draft_probs = probs
            out.append((ids, confidences))
        return out

    def propose_tree(self, seq_id: str, k: int, top: int):
        """The model-side drafter's spine of k drafts, its confidences, and at each depth its next
        `top` candidates (token, probability): the makings of a draft tree (kernels/tree.py)."""
        state = self.seqs[seq_id]
        if not state.drafts or not hasattr(self.drafter, "propose_tree"):
            raise ValueError(f"sequence {seq_id} cannot draft a tree with this drafter")
        self.settle(state)
        state.draft_probs = None  # tree drafts are deterministic
        state.caught_up = self.drafter.behind(state)
        return self.drafter.propose_tree(state, k, top)

    def verify_tree(self, seq_id: str, tree, layout: str = "mask"):
        """One target forward over a draft tree, the walk, the roll back to the kept path."""
        from kernels.tree_verify import verify_rows, verify_tree

        return (verify_tree if layout == "mask" else verify_rows)(self, seq_id, tree)

    def verify(self, seq_id: str, drafts: list[int], use_draft_probs: bool) -> tuple[int, list[int]]:
        """One target forward over [last, d_1..d_K]; returns (accepted count, emitted tokens)."""
        if self.batch is not None:
            from kernels.batch_engine import step_rows

            return step_rows(self, [(seq_id, drafts, use_draft_probs)])[0]
        state = self.seqs[seq_id]
        self.settle(state)
        tokens = mx.concatenate([state.last.astype(mx.uint32), mx.array(drafts, dtype=mx.uint32)])
        logits = processed(state, self._forward(state, tokens, verifying=True), drafts)
        if state.temperature == 0:
            accepted, emitted = accept_greedy(greedy_ids(logits).tolist(), drafts)
        else:
            p = probs_from_logits(logits, state.temperature, state.top_p)
            q = state.draft_probs[:len(drafts)] if use_draft_probs else None  # the planner may verify fewer
            accepted, emitted = accept_drafts(p, drafts, q, state.next_key())
        note(state, logits, emitted)
        return accepted, emitted

    def rollback(self, seq_id: str, drafted: int, accepted: int, emitted: list[int]) -> None:
        """Trim every cache to the accepted prefix; the last emitted token becomes the next input."""
        state = self.seqs[seq_id]
        if state.cache is None:  # batch-resident: trimmed with the others at the batch's next sync
            state.pending_trim += drafted - accepted
            state.length -= drafted - accepted
        else:
            self._trim(state, drafted - accepted)
        if (drafter := self.drafter_of(state)) is not None:  # a sequence that never drafts (a grammar's
            drafter.commit(state, drafted, accepted, emitted)  # forced run under disable_mtp) has no drafter state
        commit(state, emitted)
        state.last = mx.array(emitted[-1:], dtype=mx.uint32)
        state.draft_probs = None

    def _trim(self, state: SeqState, n: int) -> None:
        if n > 0 and state.cache is not None:
            for c in state.cache:
                c.trim(n)
            state.length -= n


def _nothing() -> None:
    pass


def _fresh_seed() -> int:
    import secrets

    return secrets.randbits(63)
