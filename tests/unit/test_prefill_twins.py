"""Prefill twins (mtp_batch): newcomers with one prompt (an n > 1 request's choices) prefill once.
A twin runs no forward of its own, yet every sequence's tokens and drafts are those of the same
group prefilled row by row, greedy and sampled, with each drafter kind."""

import pytest

from kernels.batch_prefill import split_twins
from kernels.batch_engine import step_rows
from tests.tiny import tiny_llama
from tests.unit.test_prompt_store import FIRST, engine_of

PROMPT = FIRST[:21]
OTHER = list(range(50, 62))


def items(temperature: float) -> list[tuple]:
    seed = 7 if temperature else None
    return [("a", PROMPT, temperature, 1.0, seed, True, ""),
            ("b", PROMPT, temperature, 1.0, seed and seed + 1, True, ""),  # the second choice
            ("c", OTHER, temperature, 1.0, seed, True, ""),
            ("d", PROMPT, temperature, 1.0, seed and seed + 2, True, "")]  # the third


def run(kind: str, twins: bool, temperature: float) -> tuple[dict, int, dict]:
    """Each sequence's tokens and the drafts proposed for it at every step; padded tokens; cached."""
    engine = engine_of(kind, tiny_llama(seed=11), cache=False, batched=True)
    engine.can_twin = twins
    firsts, spent = engine.prefill_chunk(items(temperature), None)
    cached = {s: engine.seqs[s].cached for s in firsts}
    outs = {s: [t] for s, t in firsts.items()}
    for _ in range(5):
        rows = [(s, engine.propose(s, 2)[0] if engine.drafter is not None else [3, 3], False) for s in sorted(outs)]
        for (seq_id, drafts, _), (accepted, emitted) in zip(rows, step_rows(engine, rows)):
            engine.rollback(seq_id, len(drafts), accepted, emitted)
            outs[seq_id] += [tuple(drafts)] + emitted
    return outs, spent, cached


@pytest.mark.parametrize("kind", ["none", "mtp", "mtp-fused", "draft-model"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_twins_decode_as_if_each_had_prefilled(kind, temperature):
    shared, spent_shared, cached = run(kind, twins=True, temperature=temperature)
    alone, spent_alone, _ = run(kind, twins=False, temperature=temperature)
    assert shared == alone
    assert spent_shared == 2 * len(PROMPT) < spent_alone == 4 * len(PROMPT)  # two rows padded, not four
    assert cached == {"a": 0, "b": len(PROMPT), "c": 0, "d": len(PROMPT)}
    if temperature == 0:  # one prompt, greedy: one answer and the same drafts
        assert shared["a"] == shared["b"] == shared["d"]


def test_twins_need_one_prompt_drafting_and_scope_and_an_opted_in_scope():
    rows, twins = split_twins([("a", [1, 2], 0, 1, None, True, ""), ("b", [1, 2], 0, 1, None, False, ""),
                               ("c", [1, 2], 0, 1, None, True, "salt:x|drafts"), ("d", [1, 2], 0, 1, None, True, None),
                               ("e", [1, 2], 0, 1, None, True, None), ("f", [1, 2], 0, 1, None, True, "")])
    assert [r[0] for r in rows] == ["a", "b", "c", "d", "e"]  # cache_prompt: false shares nothing
    assert [(t[0], b) for t, b in twins] == [("f", 0)]
