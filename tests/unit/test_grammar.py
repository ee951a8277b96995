"""Structured output on tiny random models with a tiny byte vocabulary built for JSON: the grammar's
mask holds in every path (plain, verify with drafts cut or left in, batched rows), greedy output is
identical with and without speculation, sampled output stays inside the grammar, and every answer
validates against its JSON schema."""

from __future__ import annotations

import json

import jsonschema
import llguidance
import pytest

from kernels.batch_engine import step_rows
from kernels.engine import Engine
from kernels.processing import ProcessSpec
from runtime.grammar import Constraint, grammar_for, new_matcher
from runtime.unsupported import ProtocolError
from tests.tiny import tiny_llama
from tests.unit.test_speculative_engine import make_engine

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "word", "n"],
          "properties": {"ok": {"type": "boolean"}, "word": {"enum": ["yes", "no", "maybe"]},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
PIECES = [b"{", b"}", b'"', b":", b",", b" ", b"[", b"]", b'{"', b'": ', b', "', b'"}', b"true", b"false",
          b"null", b"yes", b"no", b"may", b"be", b"ok", b"word", b"n", b'"ok', b'"word', b'"n']
TOKENS = [b"<eos>"] + PIECES + [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz0123456789"]
TOKENS += [b"x%d" % i for i in range(128 - len(TOKENS))]  # filler words the grammar never allows
EOS = 0
N = 40
PROMPTS = [[5, 9, 5, 9, 5], [3, 7, 11, 13, 17, 19, 23, 3, 7]]


class TinyVocab:
    """A byte vocabulary for llguidance (TokenizerWrapper's duck type): longest match first."""

    eos_token_id, bos_token_id, tokens, special_token_ids = EOS, None, TOKENS, [EOS]

    def __call__(self, data: bytes) -> list[int]:
        out, at = [], 0
        while at < len(data):
            best = max((i for i, t in enumerate(TOKENS) if i and data.startswith(t, at)), key=lambda i: len(TOKENS[i]))
            out.append(best)
            at += len(TOKENS[best])
        return out


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(TinyVocab()))
GRAMMAR = grammar_for({"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}})


def spec():
    return ProcessSpec(matcher=new_matcher(GRAMMAR, TOKENIZER))


def text_of(ids: list[int]) -> str:
    ids = ids[:ids.index(EOS)] if EOS in ids else ids
    return b"".join(TOKENS[i] for i in ids).decode()


def plain(model, prompt, temperature=0.0, seed=None):
    engine = Engine(model)
    engine.specs["p"] = spec()
    out = [engine.prefill("p", prompt, temperature, 1.0, seed, True)]
    while len(out) < N and out[-1] != EOS:
        out += engine.decode(["p"], [True])
    return out


def speculative(engine, prompt, k, cut: bool, temperature=0.0, seed=None):
    """Verify steps (the scheduler's cut applied or not) with plain steps mixed in."""
    engine.specs["s"] = spec()
    constraint = Constraint(GRAMMAR, TOKENIZER)
    out = [engine.prefill("s", prompt, temperature, 1.0, seed, True)]
    constraint.advance(out)
    step = 0
    while len(out) < N and EOS not in out:
        step += 1
        drafts = [] if step % 4 == 0 else engine.propose("s", k)[0]
        if cut:
            drafts = drafts[:constraint.allowed_prefix(drafts)]
        if drafts:
            accepted, emitted = engine.verify("s", drafts, use_draft_probs=True)
            engine.rollback("s", len(drafts), accepted, emitted)
        else:
            emitted = engine.decode(["s"], [True])
        constraint.advance(emitted)
        out += emitted
    return out[:out.index(EOS) + 1] if EOS in out else out


def test_response_formats_compile_and_bad_ones_are_named():
    assert grammar_for(None) is None and grammar_for({"type": "text"}) is None
    assert grammar_for({"type": "json_object"})
    for bad, param in [({"type": "xml"}, "response_format.type"),
                       ({"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}},
                        "response_format.json_schema.schema"),
                       ({"type": "json_schema", "json_schema": "x"}, "response_format.json_schema")]:
        with pytest.raises(ProtocolError) as e:
            grammar_for(bad)
        assert e.value.param == param


def test_plain_decode_under_the_grammar_gives_valid_json():
    model = tiny_llama(seed=4)
    for prompt in PROMPTS:
        out = plain(model, prompt)
        assert out[-1] == EOS
        jsonschema.validate(json.loads(text_of(out)), SCHEMA)


@pytest.mark.parametrize("kind", ["self-draft", "draft-model", "mtp"])
@pytest.mark.parametrize("cut", [True, False])
def test_greedy_with_the_grammar_equals_plain_decode(kind, cut):
    """Drafts come from the unconstrained drafter, so many fall outside the grammar: cut before
    verification, or verified and rejected by the masked target, the output is plain decode's."""
    model = tiny_llama(seed=4)
    for prompt in PROMPTS:
        assert speculative(make_engine(kind, model), prompt, 3, cut) == plain(model, prompt)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_speculation_stays_inside_the_grammar(seed):
    model = tiny_llama(seed=4)
    out = speculative(make_engine("mtp", model), PROMPTS[0], 3, cut=True, temperature=1.5, seed=seed)
    assert out[-1] == EOS
    jsonschema.validate(json.loads(text_of(out)), SCHEMA)
    jsonschema.validate(json.loads(text_of(plain(model, PROMPTS[1], temperature=1.5, seed=seed))), SCHEMA)


def test_batched_rows_mix_grammar_and_free_sequences():
    model = tiny_llama(seed=4)
    engine = make_engine("mtp", model, batched=True)
    engine.specs["0"] = spec()
    firsts, _ = engine.prefill_chunk([(str(i), p, 0.0, 1.0, None, True) for i, p in enumerate(PROMPTS)], None)
    outs = {s: [t] for s, t in firsts.items()}
    constraint = Constraint(GRAMMAR, TOKENIZER)
    constraint.advance(outs["0"])
    for step in range(N):
        if EOS in outs["0"]:
            break
        if step % 3 == 2:  # plain steps, lookahead asked for (a grammar row refuses it)
            for s, token in zip(list(outs), engine.decode(list(outs), [True, True])):
                outs[s].append(token)
            constraint.advance(outs["0"][-1:])
            continue
        proposed = {s: engine.propose(s, 2)[0] for s in outs}
        proposed["0"] = proposed["0"][:constraint.allowed_prefix(proposed["0"])]
        rows = [(s, d, True) for s, d in proposed.items()]
        for (s, drafts, _), (accepted, emitted) in zip(rows, step_rows(engine, rows)):
            if drafts:
                engine.rollback(s, len(drafts), accepted, emitted)
            outs[s] += emitted
            if s == "0":
                constraint.advance(emitted)
    got = outs["0"][:outs["0"].index(EOS) + 1]
    assert got == plain(model, PROMPTS[0])


@pytest.mark.parametrize("kind", ["mtp", "draft-model"])
def test_drafts_nobody_proposed_keep_plain_output_and_the_drafters_state(kind):
    """Forced drafts are verified without asking the drafter: every other step verifies the target's
    own continuation unproposed; the output is plain decode's, and the drafter then drafts as a
    fresh one fed the committed history."""
    from tests.unit.test_speculative_engine import plain as free_plain

    model = tiny_llama(seed=4)
    prompt = PROMPTS[1]
    oracle = free_plain(model, prompt, N + 8)
    engine = make_engine(kind, model)
    out = [engine.prefill("s", prompt, 0.0, 1.0, None, True)]
    step = 0
    while len(out) < N:
        step += 1
        if step % 3 == 0:
            out += engine.decode(["s"], [True])
            continue
        unproposed = step % 2 == 1
        drafts = oracle[len(out):len(out) + 1 + step % 3] if unproposed else engine.propose("s", 2)[0]
        accepted, emitted = engine.verify("s", drafts, use_draft_probs=not unproposed)
        engine.rollback("s", len(drafts), accepted, emitted)
        out += emitted
    assert out[:N] == oracle[:N]
    engine.settle(engine.seqs["s"])
    fresh = make_engine(kind, model)
    assert fresh.prefill("f", prompt + out[:-1], 0.0, 1.0, None, False) == out[-1]
    assert engine.propose("s", 3)[0] == fresh.propose("f", 3)[0]
    if kind == "mtp":  # the head absorbed every committed pair, none lost
        assert engine.seqs["s"].drafter["cache"][0].offset == fresh.seqs["f"].drafter["cache"][0].offset
