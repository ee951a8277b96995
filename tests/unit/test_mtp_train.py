"""MTP-head training on a tiny random model: unrolled depths match drafting, resume is exact,
data shards, draft vocabulary, batches, and prompts kept apart from the held-out sets."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kernels.mtp_batches import (
    Batches, coverage, draft_index, frequent_tokens, sequences_from, split_sequences, windows,
)
from kernels.mtp_data import generate_traces, load_shards, save_shard
from kernels.mtp_head import HEAD_WEIGHTS, load_mtp_head
from kernels.mtp_prompts import build_prompts, code_task_prompts, everyday_prompts, held_out_prompts
from kernels.mtp_loss import unrolled_mask, unrolled_outputs
from kernels.mtp_train import new_head, parser, run
from tests.tiny import tiny_llama

VOCAB = 128
PROMPTS = [[3, 17, 42, 9, 88, 5], [1, 2, 3, 4], [100, 7, 12, 64, 31], [5, 6, 7], [9, 8, 7, 6, 5, 4]]


@pytest.fixture(scope="module")
def base():
    model = tiny_llama()
    model.freeze()
    return model


@pytest.fixture(scope="module")
def data_dir(base, tmp_path_factory):
    """Two shards of greedy runs of the tiny model, as kernels.mtp_data writes them."""
    directory = tmp_path_factory.mktemp("data")
    for n, prompts in enumerate([PROMPTS * 2, PROMPTS[::-1] * 2]):
        save_shard(generate_traces(base, prompts, 14, set()), directory / f"shard-{n:05d}.safetensors")
    (directory / "recipe.json").write_text(json.dumps({"source": "tiny"}))
    return directory


def test_unrolled_mask_follows_the_drafting_cache():
    width = 6
    for depth in range(3):
        mask = np.array(unrolled_mask(width, depth))
        assert mask.shape == (width, width * (depth + 1))
        for j in range(width):
            exact = [i <= j - depth for i in range(width)]
            chain = [[i == j - depth + q for i in range(width)] for q in range(1, depth + 1)]
            assert mask[j].tolist() == exact + sum(chain, [])


def test_unrolled_depths_equal_the_drafting_chain(base):
    head = new_head(base, list(range(VOCAB)), "random", seed=3)
    tokens = [3, 17, 42, 9, 88, 5, 61, 23, 100, 7]
    hidden = base.model(mx.array([tokens]))[0]
    pairs_h, pairs_t = hidden[None, :-1], mx.array([tokens[1:]])
    outputs = unrolled_outputs(head, base, pairs_h, pairs_t, 3)
    embed, norm = base.model.embed_tokens, base.model.norm
    for j in (3, 6, 8):
        # Drafting: exact pairs 0..j-2 in the cache, then the chain with the true tokens.
        cache = head.make_cache()
        h = head.forward(pairs_h[:, : j - 1], pairs_t[:, : j - 1], embed, norm, cache)[:, -1:]
        np.testing.assert_allclose(np.array(h[0, 0]), np.array(outputs[0][0, j - 2]), atol=2e-4)
        for depth in (1, 2):
            position = j - 2 + depth
            h = head.forward(h, pairs_t[:, position : position + 1], embed, norm, cache)
            np.testing.assert_allclose(np.array(h[0, 0]), np.array(outputs[depth][0, position]),
                                       atol=2e-4)


def train_args(data_dir: Path, out: Path, steps: int, **extra) -> object:
    argv = ["--data", str(data_dir), "--out", str(out), "--steps", str(steps), "--batch", "2",
            "--window", "8", "--draft-vocab", "48", "--depths", "2", "--init", "random",
            "--lr", "3e-3", "--warmup", "2", "--log-every", "1", "--checkpoint-every", "2",
            "--eval-every", "100"]
    return parser().parse_args(argv + [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()])


def logged(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train.log").read_text().splitlines()]


def test_training_lowers_the_loss_and_records_itself(base, data_dir, tmp_path):
    out = tmp_path / "run"
    run(train_args(data_dir, out, 12), base=base)
    losses = [r["loss"] for r in logged(out) if "loss" in r]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    record = json.loads((out / "train.json").read_text())
    assert record["command"].startswith("python -m kernels.mtp_train")
    assert record["hyperparameters"]["draft_vocab"] == 48 and record["data_recipes"] == [{"source": "tiny"}]
    assert len(record["validation"]["top1_by_depth"]) == 2
    stored = mx.load(str(out / "head" / HEAD_WEIGHTS))
    assert stored["fc.weight"].dtype == mx.float16 and stored["vocab_map"].shape == (48,)
    assert load_mtp_head(out / "head").config.vocab_size == VOCAB


def test_soft_targets_add_the_base_distribution_to_the_loss(base, data_dir, tmp_path):
    """The soft term is cross-entropy against softmax(draft_lm_head(h_{j+1})): never below its
    entropy, so it adds to the loss; a run with it trains and records its weight."""
    from kernels.mtp_loss import unrolled_loss
    from kernels.mtp_train import new_head

    seqs = sequences_from(load_shards(data_dir))
    ids = frequent_tokens(seqs, 48, VOCAB)
    head = new_head(base, ids, "random", 0)
    batch = Batches(seqs, draft_index(ids, VOCAB), 8, 2, seed=0).at(0)
    hard, _, _ = unrolled_loss(head, base, batch, 2)
    both, _, _ = unrolled_loss(head, base, batch, 2, soft_weight=1.0)
    assert both.item() > hard.item()
    out = tmp_path / "soft"
    run(train_args(data_dir, out, 10, soft_weight=1.0), base=base)
    losses = [r["loss"] for r in logged(out) if "loss" in r]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    assert json.loads((out / "train.json").read_text())["hyperparameters"]["soft_weight"] == 1.0


def test_an_interrupted_run_resumes_to_the_same_head(base, data_dir, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(train_args(data_dir, straight, 6), base=base)
    run(train_args(data_dir, resumed, 6, stop_after=4), base=base)  # interrupted at step 4
    run(train_args(data_dir, resumed, 6), base=base)
    assert {"event": "resumed", "step": 4} in logged(resumed)
    a = mx.load(str(straight / "checkpoint" / HEAD_WEIGHTS))
    b = mx.load(str(resumed / "checkpoint" / HEAD_WEIGHTS))
    for name in a:
        np.testing.assert_allclose(np.array(a[name]), np.array(b[name]), atol=1e-6, err_msg=name)


def test_shards_round_trip_and_pair_tokens_with_hidden_states(base, data_dir):
    seqs = sequences_from(load_shards(data_dir))
    assert len(seqs) == 4 * len(PROMPTS)
    first = seqs[0]
    assert first.tokens[: first.prompt_len].tolist() == PROMPTS[0]
    # On the answer, the token after position t is the base's greedy token at t.
    answer = range(first.prompt_len - 1, len(first.tokens) - 1)
    assert all(first.argmax[t] == first.tokens[t + 1] for t in answer)
    assert first.argmax[-1] == -1 and not first.hidden[-1].any()
    hidden = base.model(mx.array([first.tokens.tolist()]))[0, :-1]
    np.testing.assert_allclose(first.hidden[:-1].astype(np.float32), np.array(hidden), atol=2e-2)


def test_frequent_tokens_rank_answers_then_fill_up(data_dir):
    seqs = sequences_from(load_shards(data_dir))
    ids = frequent_tokens(seqs, 48, VOCAB)
    assert len(ids) == len(set(ids)) == 48
    assert frequent_tokens(seqs, 48, VOCAB) == ids
    assert coverage(seqs, frequent_tokens(seqs, VOCAB, VOCAB)) == 1.0
    assert coverage(seqs, ids[:4]) <= coverage(seqs, ids)
    index = draft_index(ids, VOCAB)
    assert [index[t] for t in ids] == list(range(48))
    assert (index >= 0).sum() == 48


def test_windows_and_batches_are_fixed_by_seed(data_dir):
    seqs = sequences_from(load_shards(data_dir))
    train, val = split_sequences(seqs, every=5)
    assert len(val) == len(seqs) // 5 and len(train) + len(val) == len(seqs)
    assert all(2 <= length <= 8 for _, _, length in windows(train, 8))
    index = draft_index(frequent_tokens(train, 48, VOCAB), VOCAB)
    a, b = Batches(train, index, 8, 2, seed=1), Batches(train, index, 8, 2, seed=1)
    for step in (0, 3, a.steps_per_epoch + 1):
        x, y = a.at(step), b.at(step)
        assert all(np.array_equal(np.array(x[k]), np.array(y[k])) for k in x)
    batch = a.at(0)
    assert batch["hidden"].shape[:2] == batch["targets"].shape == batch["valid"].shape


def test_answers_only_trains_on_the_positions_the_head_drafts_from(data_dir):
    """A window's position j counts only where tokens[j+1] is an answer token; elsewhere the same."""
    seqs = sequences_from(load_shards(data_dir))
    index = draft_index(frequent_tokens(seqs, VOCAB, VOCAB), VOCAB)
    everything = Batches(seqs, index, 64, 1, seed=0).all()
    answers = Batches(seqs, index, 64, 1, seed=0, answers_only=True).all()
    ranked = sorted(Batches(seqs, index, 64, 1, seed=0).windows, key=lambda w: (w[2], w[0], w[1]))
    for (n, start, length), full, masked in zip(ranked, everything, answers):
        in_answer = np.arange(start + 1, start + 1 + length) >= seqs[n].prompt_len
        full_present, masked_present = np.array(full["present"][0]), np.array(masked["present"][0])
        assert np.array_equal(masked_present[:length], full_present[:length] & in_answer)
        targets = np.array(masked["targets"][0])[:length]
        assert np.array_equal(targets[in_answer], np.array(full["targets"][0])[:length][in_answer])
        assert (targets[~in_answer] == -1).all()
    assert sum(int(np.array(b["present"]).sum()) for b in answers) < sum(int(np.array(b["present"]).sum()) for b in everything)


def test_training_prompts_leave_the_held_out_sets_alone():
    held_out = []
    for name in ("chat", "code"):
        path = Path(__file__).parents[1] / "prompts" / f"{name}.jsonl"
        held_out += [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    assert held_out == held_out_prompts() and len(held_out) >= 60
    training = [p.text for p in build_prompts(800, seed=0)]
    assert len(training) == 800
    assert not any(h in t or t in h for h in held_out for t in training)
    for extra in (everyday_prompts(400, seed=0), code_task_prompts(300, seed=0)):
        texts = [p.text for p in extra]
        assert len(set(texts)) == len(extra) >= 300
        assert not any(h in t or t in h for h in held_out for t in texts)


def test_a_run_can_continue_from_a_trained_head_with_a_new_vocabulary(base, data_dir, tmp_path):
    first = run(train_args(data_dir, tmp_path / "first", 2), base=base)
    args = train_args(data_dir, tmp_path / "second", 1, init_from=str(first), draft_vocab=32)
    head = new_head(base, list(range(32)), "random", 0, args.init_from)
    earlier = load_mtp_head(first)
    np.testing.assert_array_equal(np.array(head.fc.weight), np.array(earlier.fc.weight))
    assert head.vocab_map.tolist() == list(range(32))
    second = run(args, base=base)
    assert load_mtp_head(second).config.draft_vocab_size == 32


def test_records_name_the_command_as_it_was_typed(monkeypatch):
    from kernels.mtp_data import command_line

    monkeypatch.setattr("sys.argv", ["/x/metrale", "train-mtp", "data", "--set", "everyday"])
    assert command_line("kernels.mtp_data") == "metrale train-mtp data --set everyday"
    monkeypatch.setattr("sys.argv", ["-m", "--steps", "5"])
    assert command_line("kernels.mtp_train") == "python -m kernels.mtp_train --steps 5"


def test_data_can_skip_prompts_answered_in_earlier_folders(tmp_path):
    from kernels.mtp_data import answered_prompts

    for name, texts in (("a", ["one", "two"]), ("b", ["three"])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "prompts.jsonl").write_text("".join(
            json.dumps({"kind": "general", "template": "t", "text": t}) + "\n" for t in texts))
    assert answered_prompts([str(tmp_path / "a"), str(tmp_path / "b")]) == {"one", "two", "three"}
    assert answered_prompts([]) == set()


def test_ship_cuts_the_vocabulary_stores_float16_and_keeps_the_record(base, data_dir, tmp_path):
    from kernels.heads import base_record, find_mtp_head
    from kernels.mtp_ship import ship
    from tests.tiny import save_tiny_dir

    trained = run(train_args(data_dir, tmp_path / "run", 2), base=base)
    model_dir = save_tiny_dir(tmp_path / "base")  # the tiny base as a model directory
    out = ship(trained, tmp_path / "shipped", 32, "metrale train-mtp ship", model_dir)
    stored = mx.load(str(out / HEAD_WEIGHTS))
    assert stored["draft_lm_head.weight"].shape == (32, base.args.hidden_size)
    assert stored["fc.weight"].dtype == mx.float16
    assert stored["vocab_map"].tolist() == mx.load(str(trained / HEAD_WEIGHTS))["vocab_map"][:32].tolist()
    record = json.loads((out / "train.json").read_text())
    assert record["hyperparameters"]["steps"] == 2
    assert record["shipped"] == {"draft_vocab": 32, "dtype": "float16", "command": "metrale train-mtp ship",
                                 "base_model": str(model_dir)}
    # The head records what it fits, so it is found for its base under any name.
    assert json.loads((out / "mtp_head.json").read_text())["base"] == base_record(model_dir)
    assert find_mtp_head(model_dir, explicit=str(out)) == out


def test_ship_takes_the_base_model_from_the_training_data_record():
    from kernels.mtp_ship import base_model_of

    record = {"data_recipes": [{"args": {"model": "/m/a"}}, {"args": {"model": "/m/a"}}]}
    assert str(base_model_of(record)) == "/m/a"
    for unclear in ({}, {"data_recipes": [{"args": {"model": "/m/a"}}, {"args": {"model": "/m/b"}}]}):
        with pytest.raises(SystemExit, match="--model"):
            base_model_of(unclear)
