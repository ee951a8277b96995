"""The chunked-prefill budget: a chunk costs about STEPS_PER_CHUNK decode steps, within fixed bounds."""

from hypothesis import given
from hypothesis import strategies as st

from runtime.prefill_budget import CEILING, FLOOR, STEPS_PER_CHUNK, UNMEASURED, PrefillBudget

times = st.floats(min_value=1e-5, max_value=100.0)
counts = st.integers(min_value=1, max_value=100_000)


def measured(tokens: int, prefill_s: float, step_s: float) -> PrefillBudget:
    budget = PrefillBudget()
    budget.note_prefill(tokens, prefill_s)
    budget.note_step(step_s)
    return budget


@given(counts, times, times)
def test_the_budget_stays_within_its_bounds(tokens, prefill_s, step_s):
    assert FLOOR <= measured(tokens, prefill_s, step_s).tokens() <= CEILING


@given(counts, times)
def test_until_both_are_measured_the_budget_is_the_default(tokens, seconds):
    only_prefill, only_step = PrefillBudget(), PrefillBudget()
    only_prefill.note_prefill(tokens, seconds)
    only_step.note_step(seconds)
    assert only_prefill.tokens() == only_step.tokens() == PrefillBudget().tokens() == UNMEASURED


@given(counts, times, times, times)
def test_a_slower_decode_step_never_shrinks_the_chunk(tokens, prefill_s, step_s, longer_by):
    assert measured(tokens, prefill_s, step_s + longer_by).tokens() >= measured(tokens, prefill_s, step_s).tokens()


def test_a_chunk_costs_a_few_decode_steps():
    # 1,000 prefill tokens/s and 0.2 s steps: a chunk of 200 tokens per step it may take.
    assert measured(1000, 1.0, 0.2).tokens() == round(STEPS_PER_CHUNK * 200)


@given(st.integers(min_value=0, max_value=0) | counts, st.floats(min_value=-1.0, max_value=0.0))
def test_empty_or_untimed_measurements_are_ignored(tokens, seconds):
    budget = PrefillBudget()
    budget.note_prefill(tokens, seconds)
    budget.note_step(seconds)
    assert budget.prefill_tok_s is None and budget.step_s is None
