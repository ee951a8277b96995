"""metrale bench prompt-cache end to end, small: a real server, the openai client, both workloads
cached and uncached, a row per turn and the last key=value line; and its report arithmetic."""

from runtime.bench import prompt_cache
from runtime.bench.prompt_cache import Timed


def test_report_takes_the_worse_last_turn_and_sums_every_turn():
    def pair(on_ttft, off_ttft, on_total, off_total, cached, prompt=100):
        return (Timed("a", on_ttft, on_total, prompt, cached), Timed("a", off_ttft, off_total, prompt, 0))

    runs = {"chat": [pair(1.0, 1.0, 2.0, 2.0, 0), pair(0.1, 1.0, 1.0, 3.0, 90)],
            "agent": [pair(0.2, 1.0, 1.0, 1.0, 50)]}
    last = prompt_cache.report(runs).splitlines()[-1]
    assert last == "ttft_ratio_last_turn=0.200 total_speedup=1.500 hit_rate=0.467 identical=1"


def test_bench_prompt_cache_reuses_and_answers_identically(model_dir, capsys):
    assert prompt_cache.main(["--turns", "2", "--agent-steps", "2", "--max-tokens", "8"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    keys = dict(kv.split("=") for kv in out[-1].split())
    assert list(keys) == ["ttft_ratio_last_turn", "total_speedup", "hit_rate", "identical"]
    assert keys["identical"] == "1" and float(keys["hit_rate"]) > 0.3
    assert float(keys["ttft_ratio_last_turn"]) > 0  # timings on a shared machine: no bound here
    assert "chat" in out and "agent" in out
