"""The programming training prompts: distinct, reproducible, varied, and clear of the held-out set."""

from kernels.mtp_chat_prompts import near
from kernels.mtp_program_prompts import PROGRAM_TEMPLATES, code_words, program_prompts
from kernels.mtp_prompts import code_task_prompts
from tests.unit.test_mtp_chat_prompts import assert_clear_of_the_held_out_set, assert_distinct_reproducible_and_spread


def test_program_prompts_are_distinct_reproducible_and_use_every_template():
    assert_distinct_reproducible_and_spread(program_prompts, 600, PROGRAM_TEMPLATES, 0.5)


def test_no_program_prompt_is_a_held_out_prompt_or_a_paraphrase_of_one():
    assert_clear_of_the_held_out_set(program_prompts(1500, seed=5), code_words)


def test_the_code_paraphrase_rule_ignores_boilerplate_and_catches_the_task():
    held = code_words("Write a Python function that counts the vowels in a sentence.")
    assert near(code_words("Write a JavaScript function that counts the vowels of a sentence."), held)
    assert not near(code_words("Write a Python function that counts the words in a paragraph."), held)


def test_the_set_reaches_beyond_the_code_tasks_set():
    old = {p.text for p in code_task_prompts(1480, seed=3)}
    new = [p.text for p in program_prompts(1000, seed=5)]
    assert len(old) >= 1400  # the older set is nearly exhausted at this size
    assert not set(new) & old
