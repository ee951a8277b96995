"""n > 1: each choice's Submit, and one usage for the request."""

from runtime.choices import choice_submits, merged_usage
from runtime.messages import SamplingParams, SpecReceipt, Submit, make_usage
from runtime.protocol import SEED_RANGE


def test_choices_get_their_own_ids_and_consecutive_seeds():
    submit = Submit(request_id="r", params=SamplingParams(seed=SEED_RANGE - 1), prompt="x")
    subs = choice_submits(submit, 3)
    assert [s.request_id for s in subs] == ["r", "r.1", "r.2"]
    assert [s.params.seed for s in subs] == [SEED_RANGE - 1, 0, 1]
    unseeded = choice_submits(Submit(request_id="u", params=SamplingParams(), prompt="x"), 2)
    assert [s.params.seed for s in unseeded] == [None, None]
    assert choice_submits(submit, 1) == [submit]


def test_usage_counts_the_prompt_once_and_adds_completions_and_receipts():
    a = make_usage(10, 4, SpecReceipt(drafted_tokens=3, accepted_tokens=2, drafted_by_position=(2, 1),
                                      accepted_by_position=(2, 0), verify_steps=2))
    b = make_usage(10, 5, SpecReceipt(drafted_tokens=1, accepted_tokens=1, drafted_by_position=(1,),
                                      accepted_by_position=(1,), plain_steps=3))
    usage = merged_usage([a, b])
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (10, 9, 19)
    r = usage.speculation
    assert (r.drafted_tokens, r.accepted_tokens, r.verify_steps, r.plain_steps) == (4, 3, 2, 3)
    assert r.drafted_by_position == (3, 1) and r.accepted_by_position == (3, 0)
    details = usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (3, 1)
