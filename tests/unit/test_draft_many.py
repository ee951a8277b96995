"""Batched MTP drafting (kernels/mtp_draft_many.py): every sequence's drafts, confidences and draft
probabilities are those it would draft alone, over steps with different depths, catch-ups and
temperatures, with the head compiled or not; and the output stays plain decode's."""

import mlx.core as mx
import numpy as np
import pytest

from kernels import compiled_blocks
from kernels.batch_engine import step_rows
from tests.tiny import tiny_llama
from tests.unit.test_speculative_engine import PROMPTS, make_engine, plain, prefill_group

TEMPS = (0.0, 0.0, 0.8)


def _pair(kind: str, compiled: bool):
    engines = [make_engine(kind, tiny_llama(seed=4), batched=True) for _ in range(2)]
    if compiled:
        for engine in engines:
            compiled_blocks.install_head(engine.drafter.head)
    return engines


def _run(engine, steps: int, many: bool, depth_of) -> tuple[list, dict[str, list[int]]]:
    items = [(str(i), p, t, 1.0, 7 + i, True) for i, (p, t) in enumerate(zip(PROMPTS, TEMPS))]
    firsts = prefill_group(engine, items)
    outs = {str(i): [f] for i, f in enumerate(firsts)}
    seen = []
    for step in range(steps):
        ks = {s: depth_of(int(s), step) for s in outs}
        asked = [(s, k) for s, k in ks.items() if k]
        drafted = engine.propose_many(asked) if many else [engine.propose(s, k) for s, k in asked]
        probs = [engine.seqs[s].draft_probs for s, _ in asked]
        seen.append([(ids, conf, None if q is None else np.array(q)) for (ids, conf), q in zip(drafted, probs)])
        by_id = dict(zip([s for s, _ in asked], [ids for ids, _ in drafted]))
        rows = [(s, by_id.get(s, []), True) for s in outs]
        for (s, drafts, _), (accepted, emitted) in zip(rows, step_rows(engine, rows)):
            if drafts:
                engine.rollback(s, len(drafts), accepted, emitted)
            outs[s] += emitted
    return seen, outs


@pytest.mark.parametrize("kind", ["mtp", "mtp-fused"])
@pytest.mark.parametrize("compiled", [False, True])
def test_batched_drafts_are_each_sequences_own(kind, compiled):
    """Depths 0-3 vary by sequence and step (0: a plain row, so the next draft catches up on two pairs)."""
    def depth_of(i, step):
        return (i + 2 * step) % 4

    alone, many = _pair(kind, compiled)
    seen_alone, outs_alone = _run(alone, 12, False, depth_of)
    seen_many, outs_many = _run(many, 12, True, depth_of)
    assert outs_many == outs_alone
    for step_alone, step_many in zip(seen_alone, seen_many):
        for (ids_a, conf_a, q_a), (ids_m, conf_m, q_m) in zip(step_alone, step_many):
            assert ids_m == ids_a
            np.testing.assert_allclose(conf_m, conf_a, rtol=1e-4, atol=1e-5)
            assert (q_a is None) == (q_m is None)
            if q_a is not None:
                np.testing.assert_allclose(q_m, q_a, rtol=1e-4, atol=1e-6)


def test_batched_drafting_keeps_greedy_output_plain():
    model = tiny_llama(seed=4)
    engine = make_engine("mtp", model, batched=True)
    items = [(str(i), p, 0.0, 1.0, None, True) for i, p in enumerate(PROMPTS)]
    outs = {str(i): [f] for i, f in enumerate(prefill_group(engine, items))}
    for _ in range(10):
        drafted = engine.propose_many([(s, 3) for s in outs])
        rows = [(s, ids, False) for s, (ids, _) in zip(outs, drafted)]
        for (s, drafts, _), (accepted, emitted) in zip(rows, step_rows(engine, rows)):
            engine.rollback(s, len(drafts), accepted, emitted)
            outs[s] += emitted
    for i, prompt in enumerate(PROMPTS):
        assert outs[str(i)] == plain(model, prompt, len(outs[str(i)]))


def test_a_draft_many_needs_a_depth():
    from kernels.mtp_draft_many import DraftJob, draft_many

    engine = make_engine("mtp", tiny_llama(seed=4))
    head = engine.drafter.head
    job = DraftJob(mx.zeros((1, 64)), mx.array([1]), 0, head.make_cache())
    with pytest.raises(ValueError, match="k >= 1"):
        draft_many(head, [job], engine.drafter.embed, engine.drafter.norm, engine.drafter.lm_head)


@pytest.mark.parametrize("width", [1, 3])
def test_the_calibration_probe_drafts_as_served_and_trims_back(width):
    """metrale calibrate's draft cell runs the served drafting (draft_many for a batch) and leaves
    every head cache as it found it, so each timed call drafts from the same context."""
    from kernels.calibrate import MtpDraftProbe

    engine = make_engine("mtp-fused", tiny_llama(seed=4))
    probe = MtpDraftProbe(engine.drafter.head, engine.model, width, list(range(10, 40)))
    offsets = [c[0].offset for c in probe.caches]
    for k in (1, 3, 2):
        probe(k)
    assert [c[0].offset for c in probe.caches] == offsets == [29] * width
