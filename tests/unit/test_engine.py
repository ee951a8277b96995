"""The owner's engine against mlx-lm's own generate loop on a tiny random model."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from kernels.engine import Engine
from tests.tiny import tiny_llama

PROMPTS = [[1], [5, 9], [3, 7, 11, 13, 17, 19, 23], list(range(20, 60))]


def reference_tokens(model, prompt, n, prefill_step):
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=n, prefill_step_size=prefill_step):
        out.append(int(token))
    return out


def engine_tokens(engine, seq_id, prompt, n, lookahead=True, temperature=0.0, seed=None):
    out = [engine.prefill(seq_id, prompt, temperature, 1.0, seed, lookahead)]
    while len(out) < n:
        out += engine.decode([seq_id], [lookahead and len(out) < n - 1])
    engine.release(seq_id)
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("prefill_step", [4, 2048])
def test_greedy_matches_mlx_lm(prompt, prefill_step):
    model = tiny_llama()
    engine = Engine(model, prefill_step=prefill_step)
    assert engine_tokens(engine, "s", prompt, 24) == reference_tokens(model, prompt, 24, prefill_step)


def test_lookahead_does_not_change_tokens():
    model = tiny_llama(seed=1)
    engine = Engine(model)
    with_lookahead = engine_tokens(engine, "a", PROMPTS[2], 16, lookahead=True)
    without = engine_tokens(engine, "b", PROMPTS[2], 16, lookahead=False)
    assert with_lookahead == without


def test_seeded_sampling_is_reproducible_and_varies_with_seed():
    engine = Engine(tiny_llama(seed=2))
    first = engine_tokens(engine, "a", PROMPTS[1], 24, temperature=2.0, seed=7)
    again = engine_tokens(engine, "b", PROMPTS[1], 24, temperature=2.0, seed=7)
    other = engine_tokens(engine, "c", PROMPTS[1], 24, temperature=2.0, seed=8)
    assert first == again
    assert first != other


def test_sequences_are_independent():
    engine = Engine(tiny_llama(seed=3))
    alone = engine_tokens(engine, "x", PROMPTS[3], 10)
    engine.prefill("other", PROMPTS[0], 0.0, 1.0, None, True)
    interleaved = engine_tokens(engine, "y", PROMPTS[3], 10)
    assert alone == interleaved
    assert set(engine.seqs) == {"other"}


def test_decode_without_prefill_fails_clearly():
    engine = Engine(tiny_llama())
    with pytest.raises(KeyError):
        engine.decode(["missing"], [True])
