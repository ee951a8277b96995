"""The prompt cache on a real `metrale serve` with the default model and its MTP head, speculation
forced on, in every scheduler mode, through the official openai client: a request that reuses cached
KV (an exact earlier prompt, a shorter cached prefix, a longer entry cut back) answers byte for byte
what it answers computed from scratch; salts never share; a small byte bound evicts and stays exact."""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import ServerProcess

MODES = ["serial", "mtp_batch", "hyper"]
SYSTEM = ("You are a careful assistant for a small bakery. Answer in one or two short sentences, "
          "be friendly, and never invent prices or opening hours you were not told.")
MAX_TOKENS = 20


def serve(tmp, mode: str, *extra: str) -> ServerProcess:
    batch = ("--max-active-requests", "4") if mode == "mtp_batch" else ()
    return ServerProcess(tmp, max_pending=16, extra=("--scheduler-mode", mode, *batch, "--drafter", "mtp",
                                                     "--mtp-gate", "force", "--spec-cost-model", "off", *extra))


@pytest.fixture(scope="module", params=MODES)
def cached_server(request, model_dir, tmp_path_factory):
    proc = serve(tmp_path_factory.mktemp("prompt-cache"), request.param)
    yield proc
    proc.stop()


def chat(server, messages, **extra):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    resp = client.chat.completions.create(model="default", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body=extra or None)
    details = resp.usage.prompt_tokens_details
    return resp.choices[0].message.content, resp.usage.prompt_tokens, details.cached_tokens if details else None


def fresh(server, messages, **extra):
    """The same request computed from scratch: it neither reuses nor is kept."""
    text, prompt_tokens, cached = chat(server, messages, cache_prompt=False, **extra)
    assert cached == 0
    return text


def turn(question: str, *history: str) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(history):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages + [{"role": "user", "content": question}]


def test_hits_answer_as_computed_from_scratch(cached_server):
    first = turn("Do you sell sourdough bread?")
    answer, prompt_tokens, cached = chat(cached_server, first)
    assert cached == 0

    again, _, cached = chat(cached_server, first)  # the exact prompt, cached with its answer
    assert (again, cached) == (answer, prompt_tokens - 1)

    follow = turn("And rye bread?", "Do you sell sourdough bread?", answer)  # the entry is a prefix
    text, prompt_tokens, cached = chat(cached_server, follow)
    assert text == fresh(cached_server, follow)
    assert prompt_tokens // 2 < cached < prompt_tokens

    other = turn("What is a croissant made of?")  # shares only the system prompt: a longer entry cut back
    text, prompt_tokens, cached = chat(cached_server, other)
    assert text == fresh(cached_server, other)
    assert 20 < cached < prompt_tokens - 5

    health = cached_server.health()
    account, counters = health["prompt_cache"], health["telemetry"]["counters"]
    assert account["hits"] >= 3 and account["entries"] >= 1 and account["bytes"] > 0
    assert counters["prompt_cache_hits"] == account["hits"]
    assert counters["prompt_cache_hit_tokens"] == account["hit_tokens"]


def test_salts_never_share(cached_server):
    messages = turn("Is the bakery open on Sundays?")
    answer, prompt_tokens, cached = chat(cached_server, messages, cache_salt="tenant-a")
    assert cached == 0
    text, _, cached = chat(cached_server, messages, cache_salt="tenant-b")
    assert (text, cached) == (answer, 0)
    text, _, cached = chat(cached_server, messages, cache_salt="tenant-a")
    assert (text, cached) == (answer, prompt_tokens - 1)


def test_metrics_name_the_prompt_cache(cached_server):
    import urllib.request

    chat(cached_server, turn("Do you bake cakes to order?"))
    with urllib.request.urlopen(cached_server.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    for name in ("queries", "hits", "hit_tokens", "evictions"):
        assert f"metrale_prompt_cache_{name}_total" in text, name
    assert "metrale_prompt_cache_bytes " in text


@pytest.mark.parametrize("mode", MODES)
def test_a_small_byte_bound_evicts_and_answers_stay_exact(mode, model_dir, tmp_path):
    # ~50 KB of KV and drafter state per token: room for one of these conversations, not two
    server = serve(tmp_path, mode, "--prompt-cache-bytes", "5000000")
    try:
        a = [{"role": "user", "content": "List three kinds of bread a small bakery might sell, briefly."}]
        b = [{"role": "user", "content": "Describe the smell of fresh coffee in a single short sentence."}]
        answer_a, prompt_a, _ = chat(server, a)
        answer_b, prompt_b, _ = chat(server, b)
        account = server.health()["prompt_cache"]
        assert account["evictions"] == 1 and account["entries"] == 1 and account["bytes"] <= 5_000_000
        text, _, cached = chat(server, b)
        assert (text, cached) == (answer_b, prompt_b - 1)
        text, _, cached = chat(server, a)  # its own entry (prompt_a - 1) is gone: only the opening it shares with b
        assert text == answer_a and 0 < cached < prompt_a - 10
    finally:
        server.stop()
