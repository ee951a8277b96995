"""The conversational training prompts: distinct, varied, and clear of the held-out benchmark."""

from collections import Counter

from kernels.mtp_chat_prompts import CHAT_SLOTS, CHAT_TEMPLATES, _fill, chat_prompts, content_words, near
from kernels.mtp_prompts import held_out_prompts


def assert_distinct_reproducible_and_spread(make, count: int, templates, most: float) -> None:
    """make(count, seed): `count` distinct prompts, the same for a seed and others for another, every
    template used and none taking `most` of them or more."""
    prompts = make(count, seed=0)
    texts = [p.text for p in prompts]
    assert len(set(texts)) == len(texts) == count
    assert texts == [p.text for p in make(count, seed=0)]
    assert texts != [p.text for p in make(count, seed=1)]
    counts = Counter(p.template for p in prompts)
    assert set(counts) == set(templates)  # every template is used
    assert max(counts.values()) < most * len(prompts)  # none dominates


def test_chat_prompts_are_distinct_reproducible_and_spread_over_templates():
    assert_distinct_reproducible_and_spread(chat_prompts, 900, CHAT_TEMPLATES, 0.25)


def assert_clear_of_the_held_out_set(prompts, words) -> None:
    """No prompt equal to, inside or containing a held-out prompt, nor near one by `words`."""
    held_out = held_out_prompts()
    held_words = [words(h) for h in held_out]
    for prompt in prompts:
        assert not any(h in prompt.text or prompt.text in h for h in held_out)
        assert not any(near(words(prompt.text), h) for h in held_words)


def test_no_chat_prompt_is_a_held_out_prompt_or_a_paraphrase_of_one():
    assert_clear_of_the_held_out_set(chat_prompts(1200, seed=3), content_words)


def test_the_paraphrase_rule_catches_a_reworded_benchmark_prompt_and_spares_a_new_one():
    held = content_words("Why do cats purr?")
    assert near(content_words("Why do cats purr so much?"), held)
    assert near(content_words("Can you tell me why cats purr?"), held)
    assert not near(content_words("Why do dogs wag their tails?"), held)


def test_a_slot_used_twice_in_one_prompt_draws_two_different_values():
    import random

    rng = random.Random(0)
    for _ in range(200):
        text = _fill(CHAT_TEMPLATES["cook-with"], rng)
        named = [i for i in CHAT_SLOTS["ingredient"] if f" {i}," in text or f" {i} and" in text or f"and {i}?" in text]
        assert len(named) == 3, text
