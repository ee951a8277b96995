"""metrale bench hyper end to end, small: serial and hyper servers, the tree executor, the layout
probe and the last key=value line; and its arithmetic on made-up answers."""

from runtime.bench import hyper
from runtime.bench.hyper import Answer


def test_the_fastest_run_counts_and_trajectories_hash_chunks_and_counts():
    runs = [Answer(2.0, 4, "ab", {"verify_steps": 1}, ("a", "b")), Answer(1.0, 4, "ab", {"verify_steps": 1}, ("a", "b"))]
    assert hyper.fastest(runs).seconds == 1.0
    other = [Answer(1.0, 4, "ab", {"verify_steps": 1, "verify_seconds": 9.0}, ("a", "b"))]
    assert hyper.digest(runs[:1]) == hyper.digest(other)  # seconds are not part of a trajectory
    assert hyper.digest(runs[:1]) != hyper.digest([Answer(1.0, 4, "ab", {"verify_steps": 1}, ("ab",))])
    assert hyper.accepted_per_verify([Answer(1.0, 4, "", {"verify_steps": 2, "accepted_tokens": 3})]) == 1.5


def test_bench_hyper_runs_every_part_and_ends_with_its_line(model_dir, capsys):
    argv = ["--prompts", "2", "--tree-prompts", "1", "--max-tokens", "8", "--repeats", "1", "--layout-rounds", "1"]
    assert hyper.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    keys = dict(kv.split("=") for kv in out[-1].split())
    assert list(keys) == ["parity_ratio", "identical", "tree_speedup_chat", "tree_speedup_code"]
    assert keys["identical"] == "1" and all(float(v) > 0 for v in keys.values())
    assert any("mask k=3+1 leaves" in line for line in out) and any("rows 2x4" in line for line in out)
