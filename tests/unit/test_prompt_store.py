"""The prompt cache on tiny random models: a request that reuses cached KV and drafter state gives
exactly the tokens (and drafts) of the same request on an engine without a cache, whether the entry
is an exact earlier run, a shorter prefix or a longer run cut back; serial and mtp_batch."""

import mlx.core as mx
import numpy as np
import pytest

from kernels.batch_engine import step_rows
from kernels.prompt_store import PromptStore
from tests.unit.test_speculative_engine import make_engine
from tests.tiny import tiny_llama

KINDS = ["none", "mtp", "draft-model"]
FIRST = list(range(3, 40))  # a conversation's first request
N = 16


@pytest.fixture(autouse=True)
def every_pair_kept(monkeypatch):
    """These tests check what a restore gives, so the MTP drafter absorbs every pair as a restore
    keeps it: past the bound a fresh sequence's plain step forgets its oldest pairs, and one restored
    from a run that drafted through them has them in its head (both exact; their drafts differ)."""
    monkeypatch.setattr("kernels.drafters._KEEP", 1 << 30)


def engine_of(kind, model, cache=True, batched=False, entries=8, nbytes=1 << 30):
    engine = make_engine(kind, model, batched=batched)
    if cache:
        from kernels.engine import Engine

        engine = Engine(model, drafter=engine.drafter, batched=batched, prompt_cache=PromptStore(entries, nbytes))
    return engine


def generate(engine, seq_id, prompt, kind, scope="", n=N):
    """Greedy speculative decode (drafts from the engine's drafter, or a fixed guess for 'none');
    the output, the first drafts after prefill, and the tokens reused."""
    out = [engine.prefill(seq_id, prompt, 0.0, 1.0, None, False, scope=scope)]
    first_drafts = None
    while len(out) < n:
        drafts = engine.propose(seq_id, 3)[0] if engine.drafter is not None else [out[-1]] * 2
        first_drafts = first_drafts or drafts
        accepted, emitted = engine.verify(seq_id, drafts, use_draft_probs=False)
        engine.rollback(seq_id, len(drafts), accepted, emitted)
        out += emitted
    cached = engine.seqs[seq_id].cached
    engine.release(seq_id, tuple(prompt) + tuple(out[:n]))
    return out[:n], first_drafts, cached


PROMPTS = {
    "exact": FIRST,
    "shorter prefix": FIRST[:20] + [90, 91, 92],
    "longer than the entry": None,  # FIRST + its output + more: filled in the test
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(PROMPTS))
def test_a_hit_gives_the_tokens_and_drafts_of_a_fresh_engine(kind, case):
    model = tiny_llama(seed=1)
    cached_engine = engine_of(kind, model)
    first_out, _, reused = generate(cached_engine, "a", FIRST, kind)
    assert reused == 0
    prompt = PROMPTS[case] or FIRST + first_out + [100, 101, 102, 103]
    got, got_drafts, reused = generate(cached_engine, "b", prompt, kind)
    want, want_drafts, _ = generate(engine_of(kind, model, cache=False), "b", prompt, kind)
    assert got == want
    assert got_drafts == want_drafts
    # the entry holds the first run's KV: its prompt and all but (at most) its last output token
    expected = {"exact": {len(FIRST) - 1}, "shorter prefix": {20},
                "longer than the entry": {len(FIRST) + N - 1, len(FIRST) + N}}[case]
    assert reused in expected


@pytest.mark.parametrize("kind", KINDS)
def test_a_live_sequence_never_writes_into_the_entry_it_reused(kind):
    model = tiny_llama(seed=2)
    engine = engine_of(kind, model)
    generate(engine, "a", FIRST, kind)
    (entry,) = engine.prompt_cache.index.entries.values()
    before = [np.array(k) for k, _ in entry.payload.kv]
    generate(engine, "b", FIRST[:30] + [7, 7, 7], kind, n=40)  # trims and overwrites positions 30..
    after = [np.array(k) for k, _ in entry.payload.kv]
    assert all(np.array_equal(x, y) for x, y in zip(before, after))


def test_scopes_never_share_and_opting_out_neither_reuses_nor_keeps():
    model = tiny_llama(seed=3)
    engine = engine_of("none", model)
    generate(engine, "a", FIRST, "none", scope="salt:one")
    assert generate(engine, "b", FIRST, "none", scope="salt:two")[2] == 0
    assert generate(engine, "c", FIRST, "none", scope="salt:one")[2] == len(FIRST) - 1
    entries = len(engine.prompt_cache.index.entries)
    out = [engine.prefill("d", FIRST, 0.0, 1.0, None, False, scope=None)]
    assert engine.seqs["d"].cached == 0
    engine.release("d", tuple(FIRST) + tuple(out))
    assert len(engine.prompt_cache.index.entries) == entries


def test_a_small_byte_bound_evicts_the_oldest_and_still_decodes_exactly():
    model = tiny_llama(seed=4)
    fresh = engine_of("mtp", model, cache=False)
    probe = engine_of("mtp", model)
    generate(probe, "x", FIRST, "mtp")
    one = probe.prompt_cache.index.nbytes  # about one conversation's entry
    engine = engine_of("mtp", model, nbytes=int(one * 1.5))
    generate(engine, "a", FIRST, "mtp")
    other = [50 + i for i in range(len(FIRST))]
    generate(engine, "b", other, "mtp")
    index = engine.prompt_cache.index
    assert index.stats.evictions == 1 and index.nbytes <= int(one * 1.5)
    assert generate(engine, "c", other, "mtp")[2] == len(other) - 1
    got, _, reused = generate(engine, "d", FIRST, "mtp")  # its entry was the one evicted
    assert reused == 0 and got == generate(fresh, "d", FIRST, "mtp")[0]


@pytest.mark.parametrize("kind", KINDS)
def test_mtp_batch_a_cached_newcomer_joins_the_batch_and_decodes_as_fresh(kind):
    """A decodes in the batch; B (a hit on an earlier run) joins with its own restored cache."""
    model = tiny_llama(seed=5)

    def run(cache: bool) -> dict[str, list[int]]:
        engine = engine_of(kind, model, cache=cache, batched=True)
        if cache:  # an earlier conversation, kept
            first, _ = engine.prefill_chunk([("w", FIRST, 0.0, 1.0, None, True, "")], None)
            out = [first["w"]]
            while len(out) < N:
                out += _batch_step(engine, ["w"], kind)["w"]
            engine.release("w", tuple(FIRST) + tuple(out))
        outs = {}
        firsts, _ = engine.prefill_chunk([("a", list(range(60, 80)), 0.0, 1.0, None, True, "")], None)
        outs["a"] = [firsts["a"]]
        outs["a"] += _batch_step(engine, ["a"], kind)["a"]
        firsts, _ = engine.prefill_chunk([("b", FIRST + [9, 9], 0.0, 1.0, None, True, "")], None)
        assert engine.seqs["b"].cached == (len(FIRST) if cache else 0)
        outs["b"] = [firsts["b"]]
        while min(len(o) for o in outs.values()) < N:
            for seq_id, emitted in _batch_step(engine, ["a", "b"], kind).items():
                outs[seq_id] += emitted
        return {s: o[:N] for s, o in outs.items()}

    assert run(cache=True) == run(cache=False)


def _batch_step(engine, ids, kind) -> dict[str, list[int]]:
    rows = [(s, engine.propose(s, 2)[0] if engine.drafter is not None else [3, 3], False) for s in ids]
    results = step_rows(engine, rows)
    for (seq_id, drafts, _), (accepted, emitted) in zip(rows, results):
        engine.rollback(seq_id, len(drafts), accepted, emitted)
    return {seq_id: emitted for (seq_id, _, _), (_, emitted) in zip(rows, results)}


def test_an_mtp_batch_row_is_kept_from_the_batch_cache():
    """Released from the batch, a row's entries (left padding and pending trims cut) are what a
    sequence alone would have cached: a later hit on it decodes as fresh."""
    model = tiny_llama(seed=6)
    engine = engine_of("mtp", model, batched=True)
    items = [("a", FIRST, 0.0, 1.0, None, True, ""), ("b", FIRST[:9], 0.0, 1.0, None, True, "")]
    firsts, _ = engine.prefill_chunk(items, None)
    outs = {s: [t] for s, t in firsts.items()}
    for _ in range(4):
        for seq_id, emitted in _batch_step(engine, ["a", "b"], "mtp").items():
            outs[seq_id] += emitted
    engine.release("b", tuple(FIRST[:9]) + tuple(outs["b"]))
    follow = FIRST[:9] + outs["b"] + [5, 6]
    want = generate(engine_of("mtp", model, cache=False), "x", follow, "mtp")[0]
    firsts, _ = engine.prefill_chunk([("c", follow, 0.0, 1.0, None, True, "")], None)
    assert engine.seqs["c"].cached == len(FIRST[:9]) + len(outs["b"]) - 1  # all but its last token
    out = [firsts["c"]]
    while len(out) < N:
        out += _batch_step(engine, ["a", "c"], "mtp")["c"]
    assert out[:N] == want


@pytest.mark.parametrize("batched", [False, True])
def test_a_sequence_released_with_a_lookahead_step_in_flight_is_kept_exactly(batched):
    """Plain steps with lookahead leave the next step computing at release: what is kept is the
    committed run only, and a hit on it decodes as fresh."""
    model = tiny_llama(seed=7)
    engine = engine_of("mtp", model, batched=batched)
    prompt = FIRST[:12]
    if batched:
        out = [engine.prefill_chunk([("a", prompt, 0.0, 1.0, None, True, "")], None)[0]["a"]]
    else:
        out = [engine.prefill("a", prompt, 0.0, 1.0, None, True, scope="")]
    while len(out) < 6:
        out += engine.decode(["a"], [True])  # the next plain step starts at once
    engine.release("a", tuple(prompt) + tuple(out))
    follow = prompt + out + [4, 4]
    want = generate(engine_of("mtp", model, cache=False), "x", follow, "mtp")[0]
    if batched:
        firsts, _ = engine.prefill_chunk([("b", follow, 0.0, 1.0, None, True, "")], None)
        got, cached = [firsts["b"]], engine.seqs["b"].cached
        while len(got) < N:
            got += _batch_step(engine, ["b"], "mtp")["b"]
    else:
        got, _, cached = generate(engine, "b", follow, "mtp")
    # serial drops the step in flight; the batch's had fed the last output already (both exact)
    assert cached == len(prompt) + len(out) - (0 if batched else 1)
    assert got[:N] == want


def test_a_long_run_with_its_log_packed_into_blocks_restores_exactly():
    """Past 32 logged chunks the MTP drafter copies them into blocks: a cut inside them still gives
    the drafts and tokens of a fresh engine."""
    model = tiny_llama(seed=8)
    engine = engine_of("mtp", model)
    out = generate(engine, "a", FIRST, "mtp", n=90)[0]
    assert engine.drafter.keep_log
    prompt = FIRST + out[:57] + [1, 2]
    got, got_drafts, reused = generate(engine, "b", prompt, "mtp")
    want, want_drafts, _ = generate(engine_of("mtp", model, cache=False), "b", prompt, "mtp")
    assert (got, got_drafts, reused) == (want, want_drafts, len(FIRST) + 57)


@pytest.mark.parametrize("layout", ["mask", "rows"])
def test_a_run_of_draft_tree_steps_hyper_mode_is_kept_exactly(layout):
    """Hyper mode's tree steps (alternatives off the spine accepted) leave a state the cache keeps:
    a later hit decodes, and its head drafts its first tree spine, as a fresh engine does."""
    from tests.unit.test_speculative_engine import plain
    from tests.unit.test_tree_verify import oracle_tree

    model = tiny_llama(seed=9)
    engine = engine_of("mtp", model)
    prompt = FIRST[:15]
    truth = plain(model, prompt, N + 8)
    out, step = [engine.prefill("t", prompt, 0.0, 1.0, None, False, scope="")], 0
    while len(out) < N:
        step += 1
        spine = engine.propose_tree("t", 3, top=2)[0]
        out += engine.verify_tree("t", oracle_tree(spine, truth[len(out):len(out) + 3], step), layout).emitted
    engine.release("t", tuple(prompt) + tuple(out))
    follow = prompt + out[:N] + [8, 9]
    fresh = engine_of("mtp", model, cache=False)
    spines = []
    for e in (engine, fresh):
        e.prefill("u", follow, 0.0, 1.0, None, False, scope="")
        spines.append(e.propose_tree("u", 3, top=2)[0])
    assert engine.seqs["u"].cached >= len(prompt) + N - 1
    assert spines[0] == spines[1]
    assert generate(engine, "v", follow, "mtp")[0] == generate(fresh, "v", follow, "mtp")[0]
