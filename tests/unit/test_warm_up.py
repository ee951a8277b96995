"""The server's warm-up leaves nothing behind: after it, a request's drafts and output are those of
an engine that never warmed (tiny random models, every engine-side drafter)."""

import pytest

from kernels.warm_up import WARM_ID, warm_up
from tests.tiny import tiny_llama
from tests.unit.test_speculative_engine import PROMPTS, make_engine, speculative


@pytest.mark.parametrize("kind", ["none", "draft-model", "mtp", "mtp-fused"])
def test_warming_up_leaves_no_sequence_and_changes_no_step(kind):
    model = tiny_llama(seed=4)
    for prompt in PROMPTS:
        cold, warm = make_engine(kind, model), make_engine(kind, model)
        warm_up(warm, 3, vocab_size=128)
        assert WARM_ID not in warm.seqs and not warm.seqs
        drafter = "ngram" if kind == "none" else kind  # no engine-side drafter: n-gram drafts
        assert speculative(warm, drafter, prompt, 3, True, full=True) == \
            speculative(cold, drafter, prompt, 3, True, full=True)


def test_a_batched_engine_is_not_warmed():
    engine = make_engine("mtp", tiny_llama(seed=4), batched=True)
    warm_up(engine, 3, vocab_size=128)
    assert not engine.seqs
