"""measure_acceptance on a tiny random model: counting rules, pairing with the base, prompt sets."""

from __future__ import annotations

from types import SimpleNamespace

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from kernels.mtp_eval import AcceptanceReport, load_prompt_set, measure_acceptance, measure_heads
from kernels.mtp_head import MTPConfig, MTPHead
from tests.tiny import tiny_llama

PROMPTS = [[3, 17, 42, 9, 88, 5], [1, 2, 3, 4], [100, 7, 12, 64, 31, 30, 29]]
PROMPT_SETS = Path(__file__).parents[1] / "prompts"


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def random_head(seed: int = 1) -> MTPHead:
    mx.random.seed(seed)
    head = MTPHead(MTPConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=128))
    mx.eval(head.parameters())
    return head


def greedy_answer(model, prompt, max_tokens):
    """The base's greedy continuation at width 1, from mlx-lm's own loop."""
    steps = generate_step(mx.array(prompt), model, max_tokens=max_tokens)
    return [int(token) for token, _ in steps]


class ScriptedHead:
    """Drafts the base's true continuation for its first `right` depths, then wrong tokens."""

    config = SimpleNamespace(feature_layers=())  # reads the last hidden state, as a last-layer head

    def __init__(self, tokens, right):
        self.tokens, self.right, self.fed = tokens, right, 0

    def make_cache(self):
        return None

    def absorb(self, hidden, next_tokens, *rest):
        self.fed += len(next_tokens)

    def draft(self, hidden, next_tokens, k, *rest):
        self.fed += len(next_tokens)
        truth = self.tokens[self.fed + 1 : self.fed + 1 + k]
        ids = [t if i < self.right else (t + 1) % 128 for i, t in enumerate(truth)]
        return type("Draft", (), {"ids": ids + [0] * (k - len(ids))})


@pytest.mark.parametrize("right, want", [(4, (1.0, 1.0, 1.0, 1.0)), (2, (1.0, 1.0, 0.0, 0.0)),
                                         (0, (0.0, 0.0, 0.0, 0.0))])
def test_acceptance_counts_matching_prefixes(model, right, want):
    prompt = PROMPTS[0]
    tokens = prompt + greedy_answer(model, prompt, 12)
    report = measure_acceptance(model, ScriptedHead(tokens, right), [prompt], 4, 12)
    assert report.by_position == want
    # One draft step per emitted token that has a successor; fewer near the end for deep drafts.
    assert report.eligible == (11, 10, 9, 8)


def reference_acceptance(model, head, prompt, k, max_tokens):
    """Brute force: for each step, a fresh head cache fed every exact pair so far, then drafts."""
    tokens = prompt + greedy_answer(model, prompt, max_tokens)
    hidden = model.model(mx.array([tokens]))[0]
    embed, norm = model.model.embed_tokens, model.model.norm
    accepted, eligible = np.zeros(k, int), np.zeros(k, int)
    for t in range(len(prompt) - 1, len(tokens) - 2):
        drafted = head.draft(hidden[: t + 1], tokens[1 : t + 2], k, embed, norm, model.lm_head,
                             head.make_cache()).ids
        upcoming = tokens[t + 2 : t + 2 + k]
        eligible[: len(upcoming)] += 1
        n = 0
        while n < len(upcoming) and drafted[n] == upcoming[n]:
            n += 1
        accepted[:n] += 1
    return accepted, eligible


def test_replay_pairs_each_hidden_state_with_the_token_it_emitted(model):
    head = random_head()
    k, max_tokens = 3, 10
    report = measure_acceptance(model, head, PROMPTS, k, max_tokens)
    accepted, eligible = np.zeros(k, int), np.zeros(k, int)
    for prompt in PROMPTS:
        a, e = reference_acceptance(model, head, prompt, k, max_tokens)
        accepted, eligible = accepted + a, eligible + e
    assert report.eligible == tuple(eligible.tolist())
    assert report.accepted == tuple(accepted.tolist())


def test_batched_base_runs_measure_the_same(model):
    head = random_head()
    one = measure_acceptance(model, head, PROMPTS, 2, 8)
    batched = measure_acceptance(model, head, PROMPTS, 2, 8, batch=3)
    assert batched == one


def test_several_heads_share_one_base_run_and_measure_as_alone(model):
    first, second = random_head(), random_head(seed=3)
    together = measure_heads(model, [first, second], PROMPTS, 2, 8, batch=2)
    assert together == [measure_acceptance(model, first, PROMPTS, 2, 8),
                        measure_acceptance(model, second, PROMPTS, 2, 8)]


def test_stop_ids_end_the_continuation(model):
    prompt = PROMPTS[1]
    answer = greedy_answer(model, prompt, 10)
    stop = answer[3]
    cut = answer.index(stop) + 1  # the stop token is emitted, then the run ends
    report = measure_acceptance(model, random_head(), [prompt], 2, 10, stop_ids=[stop])
    assert report.eligible[0] == cut - 1


def test_report_views():
    report = AcceptanceReport(k_max=3, prompts=2, accepted=(8, 4, 1), eligible=(10, 8, 5))
    assert report.steps == 10
    assert report.by_position == (0.8, 0.5, 0.2)
    assert report.expected_accepted(2) == pytest.approx(1.3)
    assert json.loads(json.dumps(report.as_dict()))["by_position"] == [0.8, 0.5, 0.2]


class Tokenizer:
    bos_token = None

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return f"<user>{messages[0]['content']}<assistant>"

    def encode(self, text, add_special_tokens):
        return [ord(c) % 128 for c in text]


@pytest.mark.parametrize("name", ["chat", "code"])
def test_held_out_prompt_sets_load_and_are_large_enough(name):
    prompts = load_prompt_set(PROMPT_SETS / f"{name}.jsonl", Tokenizer())
    assert len(prompts) >= 30
    texts = [json.loads(line)["prompt"] for line in (PROMPT_SETS / f"{name}.jsonl").open()]
    assert len(set(texts)) == len(texts)


def test_draft_timing_gives_milliseconds(model):
    from kernels.mtp_eval import draft_ms

    head = random_head()
    assert 0 < draft_ms(model, head, 3, context=16, repeats=3) < 10_000
