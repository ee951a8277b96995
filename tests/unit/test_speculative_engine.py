"""Speculative steps on tiny random models: greedy output equals plain decode for every drafter and K,
also when plain steps with lookahead are mixed in (a dropped lookahead must leave nothing behind)."""

import mlx.core as mx
import pytest

from kernels.drafters import DraftModelDrafter, MtpDrafter
from kernels.engine import Engine
from kernels.mtp_head import MTPConfig, MTPHead
from kernels.ngram import propose_ngram
from tests.tiny import tiny_llama

PROMPTS = [[5, 9, 5, 9, 5], [3, 7, 11, 13, 17, 19, 23, 3, 7], list(range(20, 50))]
N = 28  # tokens compared per prompt


def plain(model, prompt, n=N):
    engine = Engine(model)
    out = [engine.prefill("p", prompt, 0.0, 1.0, None, True)]
    while len(out) < n:
        out += engine.decode(["p"], [True])
    return out


def prefill_group(engine, items) -> list[int]:
    """Prefill several sequences in one go (one chunk without a budget); their first tokens."""
    firsts, _ = engine.prefill_chunk(items, None)
    return list(firsts.values())


def make_engine(kind, model, batched=False):
    if kind == "draft-model":
        return Engine(model, drafter=DraftModelDrafter(tiny_llama(seed=11)), batched=batched)
    if kind == "self-draft":  # the target as its own draft model: every draft is accepted
        return Engine(model, drafter=DraftModelDrafter(model), batched=batched)
    if kind in ("mtp", "mtp-fused"):
        mx.random.seed(5)
        # mtp-fused: fed decoder layer 0's output with the last hidden state (random fusion weights)
        head = MTPHead(MTPConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=128, feature_layers=(0,) if kind == "mtp-fused" else ()))
        mx.eval(head.parameters())
        return Engine(model, drafter=MtpDrafter(head, model), batched=batched)
    return Engine(model, batched=batched)


def head_input(model, history: mx.array, drafter) -> mx.array:
    """What the runtime feeds the drafter's head for a history, at every position."""
    from kernels.features import body

    return body(model, history[None], None, drafter.feature_layers)[1][0]


def speculative(engine, kind, prompt, k, mix_plain, temperature=0.0, seed=None, full=False, oracle=None,
                ahead_after_verify=False):
    """oracle: the target's own greedy continuation; when given, every other step verifies it instead
    of the drafter's proposal, so steps accept several drafts even with a random head.
    ahead_after_verify: every other verify starts the next plain step at once (the scheduler's
    start_ahead), which the next step then takes (a plain step) or drops (a draft)."""
    out = [engine.prefill("s", prompt, temperature, 1.0, seed, lookahead=mix_plain)]
    steps = 0
    while len(out) < N:
        steps += 1
        if mix_plain and steps % 3 == 0:
            out += engine.decode(["s"], [True])  # leaves a lookahead step in flight
            continue
        drafts = propose_ngram(prompt + out, k) if kind == "ngram" else engine.propose("s", k)[0]
        if oracle is not None and steps % 2:
            drafts = oracle[len(out):len(out) + k]
        if not drafts:
            out += engine.decode(["s"], [False])
            continue
        accepted, emitted = engine.verify("s", drafts, use_draft_probs=kind != "ngram")
        assert 0 <= accepted <= len(drafts) and len(emitted) == accepted + 1
        engine.rollback("s", len(drafts), accepted, emitted)
        if ahead_after_verify and steps % 2:
            engine.start_ahead(["s"])
        out += emitted
    return out if full else out[:N]


@pytest.mark.parametrize("kind", ["ngram", "draft-model", "self-draft", "mtp", "mtp-fused"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("mix_plain", [False, True])
def test_greedy_speculation_equals_plain_decode(kind, k, mix_plain):
    model = tiny_llama(seed=4)
    for prompt in PROMPTS:
        engine = make_engine(kind, model)
        assert speculative(engine, kind, prompt, k, mix_plain) == plain(model, prompt)[:N]


@pytest.mark.parametrize("kind", ["ngram", "draft-model", "mtp"])
@pytest.mark.parametrize("k", [1, 3])
def test_a_plain_step_started_right_after_a_verify_keeps_plain_output(kind, k):
    model = tiny_llama(seed=4)
    for prompt in PROMPTS:
        engine = make_engine(kind, model)
        assert speculative(engine, kind, prompt, k, True, ahead_after_verify=True) == plain(model, prompt)[:N]


def test_self_drafting_accepts_every_draft():
    model = tiny_llama(seed=4)
    engine = make_engine("self-draft", model)
    engine.prefill("s", PROMPTS[2], 0.0, 1.0, None, False)
    for _ in range(4):
        drafts, confidences = engine.propose("s", 4)
        accepted, emitted = engine.verify("s", drafts, True)
        engine.rollback("s", 4, accepted, emitted)
        assert accepted == 4 and len(confidences) == 4
        assert all(c <= 0 for c in confidences)


@pytest.mark.parametrize("kind", ["ngram", "draft-model", "mtp"])
def test_sampled_speculation_is_reproducible(kind):
    model = tiny_llama(seed=4)
    runs = [speculative(make_engine(kind, model), kind, PROMPTS[1], 3, True, temperature=1.0, seed=3)
            for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("spell", [1, 36, 40, 63, 130])
def test_a_draft_after_a_long_plain_spell_catches_up_within_the_compiled_block(spell, monkeypatch):
    """Plain steps keep pairs pending up to a bound, then absorb them in one forward; a draft after any
    spell feeds its own forward at most MAX_ROWS rows (it absorbs more pending first), so that forward
    stays compiled: the stock block's cost grew with the spell (130-170 ms after 400 plain steps)."""
    from kernels.compiled_blocks import MAX_ROWS
    from kernels.drafters import _ABSORB_AFTER

    engine = make_engine("mtp", tiny_llama(seed=4))
    head, fed_rows, most_pending = engine.drafter.head, [], 0
    real_draft = head.draft
    monkeypatch.setattr(head, "draft", lambda h, *a, **kw: fed_rows.append(h.shape[0]) or real_draft(h, *a, **kw))
    engine.prefill("s", PROMPTS[2], 0.0, 1.0, None, lookahead=True)
    state = engine.seqs["s"]
    for _ in range(spell):
        engine.decode(["s"], [True])
        engine.settle(state)  # as a draft would: the lookahead's feed is undone
        most_pending = max(most_pending, state.drafter["pending"])
    pending = state.drafter["pending"]
    engine.propose("s", 2)
    assert most_pending <= _ABSORB_AFTER
    assert fed_rows[-1] == (1 if pending >= MAX_ROWS else pending + 1)
    assert fed_rows[-1] <= MAX_ROWS


@pytest.mark.parametrize("kind", ["mtp", "mtp-fused"])
def test_mtp_head_sees_exactly_the_committed_pairs(kind):
    """After plain and verify steps, the head's drafts equal a fresh head fed the whole history, also
    when lookahead feeds are undone."""
    model = tiny_llama(seed=4)
    engine = make_engine(kind, model)
    head, prompt = engine.drafter.head, PROMPTS[1]
    out = speculative(engine, kind, prompt, 3, mix_plain=True, full=True, oracle=plain(model, prompt) * 2)
    state = engine.seqs["s"]
    engine.settle(state)
    history = mx.array(prompt + out, dtype=mx.uint32)
    assert state.length == history.size - 1  # every committed token but `last` is in the cache
    drafter = engine.drafter
    hidden = head_input(model, history, drafter)  # positions 0..length; the last one's next token is unknown
    pairs_h, pairs_t = hidden[:-1], history[1:]
    expected = head.draft(pairs_h, pairs_t, 3, drafter.embed, drafter.norm, drafter.lm_head, head.make_cache())
    got_ids, got_logprobs = engine.propose("s", 3)
    assert got_ids == expected.ids
    assert got_logprobs == pytest.approx(expected.logprobs, abs=1e-4)


@pytest.mark.parametrize("kind", ["mtp", "mtp-fused"])
@pytest.mark.parametrize("absorbed_first", [False, True])
def test_a_sequence_that_does_not_draft_keeps_only_its_newest_pairs(kind, absorbed_first, monkeypatch):
    """Past a bound of pending pairs, plain steps forget the oldest: the next draft equals a fresh head
    fed the pairs absorbed before the spell, then only the newest ones kept."""
    monkeypatch.setattr("kernels.drafters._ABSORB_AFTER", 9)
    monkeypatch.setattr("kernels.drafters._KEEP", 5)
    model = tiny_llama(seed=4)
    engine = make_engine(kind, model)
    drafter, prompt = engine.drafter, PROMPTS[1]  # its 8 pairs stay under the bound
    out = [engine.prefill("s", prompt, 0.0, 1.0, None, lookahead=True)]
    state = engine.seqs["s"]
    if absorbed_first:  # a speculative step takes every pending pair into the head's cache
        drafts = engine.propose("s", 2)[0]
        accepted, emitted = engine.verify("s", drafts, True)
        engine.rollback("s", len(drafts), accepted, emitted)
        out += emitted
    for _ in range(14):
        out += engine.decode(["s"], [True])
        assert state.drafter["pending"] <= 9
    engine.settle(state)
    kept, absorbed = state.drafter["pending"], state.drafter["exact"]  # the head's rows before the spell
    assert absorbed == (len(prompt) if absorbed_first else 0)
    assert state.length == len(prompt) + len(out) - 1
    history = mx.array(prompt + out, dtype=mx.uint32)
    hidden = head_input(model, history, drafter)
    pairs_h, pairs_t = hidden[:-1], history[1:]
    cache = drafter.head.make_cache()
    if absorbed:
        drafter.head.absorb(pairs_h[:absorbed], pairs_t[:absorbed], drafter.embed, drafter.norm, cache)
    expected = drafter.head.draft(pairs_h[-(kept + 1):], pairs_t[-(kept + 1):], 3, drafter.embed, drafter.norm,
                                  drafter.lm_head, cache)
    got_ids, got_logprobs = engine.propose("s", 3)
    assert state.caught_up == kept + 1
    assert got_ids == expected.ids
    assert got_logprobs == pytest.approx(expected.logprobs, abs=1e-4)


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculation_equals_plain_decode_while_pairs_are_forgotten(k, monkeypatch):
    monkeypatch.setattr("kernels.drafters._ABSORB_AFTER", 3)
    monkeypatch.setattr("kernels.drafters._KEEP", 1)
    model = tiny_llama(seed=4)
    for prompt in PROMPTS:
        assert speculative(make_engine("mtp", model), "mtp", prompt, k, True) == plain(model, prompt)[:N]


def test_plain_decode_feeds_the_head_every_pair_once():
    """Exact pairs wait for the next draft, or for a compiled block's worth of them: every committed
    pair reaches the head's cache once, absorbed or in the draft's own forward."""
    from kernels.drafters import _ABSORB_AFTER

    model = tiny_llama(seed=4)
    engine = make_engine("mtp", model)
    engine.prefill("s", PROMPTS[2], 0.0, 1.0, None, True)
    for _ in range(12):
        engine.decode(["s"], [True])
    engine.settle(engine.seqs["s"])
    d = engine.seqs["s"].drafter
    assert d["cache"][0].offset + d["pending"] == len(PROMPTS[2]) - 1 + 12
    assert d["pending"] <= _ABSORB_AFTER
    engine.propose("s", 2)
    assert d["cache"][0].offset == len(PROMPTS[2]) + 12 and d["pending"] == 0


@pytest.mark.parametrize("kind", ["draft-model", "mtp"])
def test_each_draft_says_what_it_first_caught_up_on(kind):
    """A draft after the prompt or plain steps catches up on every token they fed (the controller
    keeps its cost out of the draft cell); a dropped lookahead is not among them; a draft in a run
    of speculative steps catches up on at most the one token a fully accepted draft model missed."""
    engine = make_engine(kind, tiny_llama(seed=4))
    prompt = PROMPTS[2]
    engine.prefill("s", prompt, 0.0, 1.0, None, True)
    for _ in range(5):
        engine.decode(["s"], [True])  # the last one leaves a lookahead in flight: propose drops it
    state = engine.seqs["s"]
    drafts = engine.propose("s", 2)[0]
    assert state.caught_up == len(prompt) + 5
    for _ in range(3):
        accepted, emitted = engine.verify("s", drafts, False)
        engine.rollback("s", len(drafts), accepted, emitted)
        drafts = engine.propose("s", 2)[0]
        assert state.caught_up <= (1 if kind == "draft-model" else 0)
    accepted, emitted = engine.verify("s", drafts, False)
    engine.rollback("s", len(drafts), accepted, emitted)
    engine.decode(["s"], [False])
    engine.propose("s", 2)
    assert state.caught_up in ((1, 2) if kind == "draft-model" else (1,))


@pytest.mark.parametrize("kind", ["ngram", "draft-model", "mtp", "mtp-fused"])
def test_batched_rows_equal_each_sequence_alone(kind):
    """Sequences of different lengths step together, some plain and some with drafts of different
    depths; each one's greedy output equals its plain decode alone."""
    from kernels.batch_engine import step_rows

    model = tiny_llama(seed=4)
    engine = make_engine(kind, model, batched=True)
    firsts = prefill_group(engine, [(str(i), p, 0.0, 1.0, None, True) for i, p in enumerate(PROMPTS[:2])])
    outs = {i: [first] for i, first in enumerate(firsts)}
    step = 0
    while min(len(o) for o in outs.values()) < N:
        step += 1
        if step == 5:  # a third sequence joins the running batch
            outs[2] = [engine.prefill("2", PROMPTS[2], 0.0, 1.0, None, False)]
        rows = []
        for i, out in outs.items():
            k = (i + step) % 4  # 0: a plain row
            drafts = [] if k == 0 else (propose_ngram(PROMPTS[i] + out, k) if kind == "ngram"
                                        else engine.propose(str(i), k)[0])
            rows.append((str(i), drafts, kind != "ngram"))
        for (seq_id, drafts, _), (accepted, emitted) in zip(rows, step_rows(engine, rows)):
            if drafts:
                engine.rollback(seq_id, len(drafts), accepted, emitted)
            outs[int(seq_id)] += emitted
    engine.release("0")  # a sequence leaves; the others go on in a narrower batch
    for _ in range(4):
        for seq_id, (_, emitted) in zip(("1", "2"), step_rows(engine, [("1", [], False), ("2", [], False)])):
            outs[int(seq_id)] += emitted
    for i, prompt in enumerate(PROMPTS):
        assert outs[i] == plain(model, prompt, len(outs[i]))


@pytest.mark.parametrize("kind", ["draft-model", "mtp"])
def test_verifying_fewer_drafts_than_proposed_keeps_plain_output(kind):
    """The planner may verify only some of a sequence's drafts; the drafter's caches must follow."""
    model = tiny_llama(seed=4)
    engine = make_engine(kind, model)
    prompt = PROMPTS[2]
    out = [engine.prefill("s", prompt, 0.0, 1.0, None, False)]
    oracle = plain(model, prompt, N + 8)
    step = 0
    while len(out) < N:
        step += 1
        proposed = engine.propose("s", 4)[0]
        # The MTP head keeps only exact pairs, so any drafts may be verified; the draft model's cache
        # holds its own proposals, so only a prefix of them may.
        use_oracle = kind == "mtp" and step % 2
        drafts = (oracle[len(out):len(out) + 4] if use_oracle else proposed)[:1 + step % 3]
        accepted, emitted = engine.verify("s", drafts, use_draft_probs=step % 2 == 0)
        engine.rollback("s", len(drafts), accepted, emitted)
        out += emitted
    assert out[:N] == oracle[:N]
    # The drafter's own state still matches a fresh one that saw only the committed history.
    fresh = make_engine(kind, model)
    assert fresh.prefill("f", prompt + out[:-1], 0.0, 1.0, None, False) == out[-1]
    assert engine.propose("s", 3)[0] == fresh.propose("f", 3)[0]


@pytest.mark.parametrize("kind", ["ngram", "mtp"])
def test_batched_lookahead_leaves_every_token_unchanged(kind):
    """Plain batch steps with lookahead (also started right after a verify), mixed with speculative
    steps, a join and a leave (each of which drops a lookahead step): every sequence, one of them sampled with a seed, emits exactly
    what it emits without lookahead, and greedy ones what plain decode alone emits."""
    from kernels.batch_engine import step_rows

    model = tiny_llama(seed=4)

    def run(ahead: bool, launch: bool = True) -> dict[str, list[int]]:
        engine = make_engine(kind, model, batched=True)
        firsts = prefill_group(engine, [("0", PROMPTS[0], 0.0, 1.0, None, True), ("1", PROMPTS[1], 0.9, 1.0, 7, True)])
        outs, done = {"0": [firsts[0]], "1": [firsts[1]]}, {}
        for step in range(1, 26):
            if step == 6:  # joins while a lookahead step is in flight
                outs["2"] = [engine.prefill("2", PROMPTS[2], 0.0, 1.0, None, False)]
            if step == 17:  # leaves; the lookahead step of the others is still used
                engine.release("0")
                done["0"] = outs.pop("0")
            if step % 5 == 0:
                rows = [(s, [] if s == "1" else (propose_ngram(PROMPTS[int(s)] + out, 2) if kind == "ngram"
                                                 else engine.propose(s, 2)[0]), kind != "ngram")
                        for s, out in outs.items()]
                for (s, drafts, _), (accepted, emitted) in zip(rows, step_rows(engine, rows)):
                    if drafts:
                        engine.rollback(s, len(drafts), accepted, emitted)
                    outs[s] += emitted
                if ahead:  # the scheduler's start_ahead: the next plain step begins at once
                    engine.start_ahead(list(outs))
            else:
                for s, token in zip(list(outs), engine.decode(list(outs), [ahead] * len(outs), launch=launch)):
                    outs[s].append(token)
                if ahead and not launch and step % 2:  # the owner starts it after replying; else never started
                    engine.start_ahead(list(outs))
        return {**outs, **done}

    with_lookahead, without = run(True), run(False)
    assert with_lookahead == without == run(True, launch=False)
    for s in ("0", "2"):
        assert with_lookahead[s] == plain(model, PROMPTS[int(s)], len(with_lookahead[s]))


@pytest.mark.parametrize("batched", [False, True])
def test_a_lookahead_built_before_the_reply_is_the_one_started_after_it(batched):
    """The model owner builds the next plain step before replying (decode with launch=False) and starts
    it after (start_ahead): started, not built again, and the next decode takes it."""
    model = tiny_llama(seed=4)
    engine = make_engine("mtp", model, batched=batched)
    out = [engine.prefill("s", PROMPTS[1], 0.0, 1.0, None, False)] if not batched else \
        prefill_group(engine, [("s", PROMPTS[1], 0.0, 1.0, None, True)])
    out += engine.decode(["s"], [True], launch=False)
    built = engine.batch.ahead if batched else engine.seqs["s"]
    tokens = built.tokens if batched else built.pending
    assert built.started is False if batched else built.pending_started is False
    engine.start_ahead(["s"])
    started = engine.batch.ahead if batched else engine.seqs["s"]
    assert (started.tokens if batched else started.pending) is tokens
    assert started.started if batched else started.pending_started
    out += engine.decode(["s"], [False])
    assert out == plain(model, PROMPTS[1], len(out))


@pytest.mark.parametrize("kind", ["draft-model", "mtp"])
def test_a_sequence_that_never_drafts_is_never_fed(kind):
    """disable_mtp: the drafter keeps no state for the sequence (its feed would be wasted work), the
    sequence decodes as alone, and a drafting neighbour in the same batch is unaffected."""
    from kernels.batch_engine import step_rows

    model = tiny_llama(seed=4)
    engine = make_engine(kind, model, batched=True)
    firsts = prefill_group(engine, [("on", PROMPTS[0], 0.0, 1.0, None, True), ("off", PROMPTS[1], 0.0, 1.0, None, False)])
    outs = {"on": [firsts[0]], "off": [firsts[1]]}
    for step in range(N):
        if step % 2:
            tokens = engine.decode(["on", "off"], [True, True])
            outs["on"].append(tokens[0])
            outs["off"].append(tokens[1])
            continue
        rows = [("on", engine.propose("on", 2)[0], True), ("off", [], False)]
        (accepted, emitted), (_, plain_token) = step_rows(engine, rows)
        engine.rollback("on", 2, accepted, emitted)
        outs["on"] += emitted
        outs["off"] += plain_token
    assert engine.seqs["off"].drafter == {}
    assert engine.seqs["on"].drafter != {}
    with pytest.raises(ValueError, match="never drafts"):
        engine.propose("off", 2)
    assert outs["on"][:N] == plain(model, PROMPTS[0])
    assert outs["off"][:N] == plain(model, PROMPTS[1])


@pytest.mark.parametrize("kind", ["none", "mtp", "mtp-fused"])
def test_a_group_prefilled_in_chunks_between_steps_decodes_as_alone(kind):
    """Chunked prefill: a group of two (different lengths, so left padding) prefills a few positions
    per call while a running sequence keeps decoding with lookahead, then joins; every sequence's
    greedy output equals its plain decode alone, and the MTP head saw exactly the committed pairs."""
    model = tiny_llama(seed=4)
    engine = make_engine(kind, model, batched=True)
    outs = {"0": prefill_group(engine, [("0", PROMPTS[0], 0.0, 1.0, None, True)])}
    chunks, firsts = 0, None
    group = [("1", PROMPTS[1], 0.0, 1.0, None, True), ("2", PROMPTS[2], 0.0, 1.0, None, True)]
    while True:
        firsts, spent = engine.prefill_chunk(group if chunks == 0 else [], budget=8)
        chunks += 1
        assert spent <= 8 + 2  # two rows x four positions, plus the final position once done
        if firsts is not None:
            break
        outs["0"] += engine.decode(["0"], [True])  # its lookahead step survives the chunks
    assert chunks == -(-(len(PROMPTS[2]) - 1) // 4)  # the longest prompt, four positions per chunk
    outs.update({s: [t] for s, t in firsts.items()})
    while min(len(o) for o in outs.values()) < N:
        for s, token in zip(list(outs), engine.decode(list(outs), [True] * len(outs))):
            outs[s].append(token)
    for s, out in outs.items():
        assert out[:N] == plain(model, PROMPTS[int(s)]), s
    if kind != "none":  # the head drafts as if fed the whole history at once
        state = engine.seqs["2"]
        engine.batch.drop_ahead(engine)
        history = mx.array(PROMPTS[2] + outs["2"], dtype=mx.uint32)
        drafter = engine.drafter
        hidden = head_input(model, history, drafter)
        expected = drafter.head.draft(hidden[:-1], history[1:], 2, drafter.embed, drafter.norm, drafter.lm_head,
                                      drafter.head.make_cache())
        assert state.length == history.size - 1
        assert engine.propose("2", 2)[0] == expected.ids
