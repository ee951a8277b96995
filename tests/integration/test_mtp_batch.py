"""mtp_batch on the default model: every request of a batch (mixed prompt lengths, one joining
mid-way, some with speculation disabled) answers exactly what it answers alone with plain decode,
drafted by n-gram lookup and by the MTP head shipped for the model."""

import asyncio

import aiohttp
import pytest

from tests.integration.conftest import ServerProcess

PROMPTS = ["def add(a, b):", "The capital of France is", "Write a haiku about rain, then explain it.\n",
           "1, 2, 3, 4, 5,", "import os\nimport sys\n\ndef main():\n"]
MAX_TOKENS = 24


@pytest.fixture(scope="module", params=["ngram", "mtp"])
def batch_server(request, model_dir, tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("batch"), max_pending=16,
                         extra=("--scheduler-mode", "mtp_batch", "--max-active-requests", "4",
                                "--batch-wait-ms", "5", "--drafter", request.param, "--mtp-gate", "force",
                                "--spec-cost-model", "off", "--num-draft-tokens", "2"))
    yield proc
    proc.stop()


async def complete(http, url, prompt, delay=0.0, **extra):
    await asyncio.sleep(delay)
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_batched_requests_equal_plain_decode_alone(batch_server, idle_server):
    async with aiohttp.ClientSession() as http:
        together = await asyncio.gather(*(
            complete(http, batch_server.url, p, delay=1.5 if i == 4 else 0.0, disable_mtp=i == 1)
            for i, p in enumerate(PROMPTS)))
        alone = [await complete(http, idle_server.url, p, disable_mtp=True) for p in PROMPTS]
    for i, (got, want) in enumerate(zip(together, alone)):
        assert got["choices"][0]["text"] == want["choices"][0]["text"], PROMPTS[i]
    assert together[1]["usage"]["speculation"]["verify_steps"] == 0
    assert any(r["usage"]["speculation"]["verify_steps"] for r in together)
    async with aiohttp.ClientSession() as http, http.get(batch_server.url + "/health") as r:
        stats = (await r.json())["scheduler"]["mtp_batch"]
    assert max(int(w) for w in stats["batch_width_histogram"]) >= 2
    assert stats["rows_verified"] > 0


async def test_invalid_batch_settings_are_refused_at_start(tmp_path):
    import subprocess
    import sys

    from tests.integration.conftest import ROOT

    for flags, message in ((["--max-active-requests", "0"], "at least 1"),
                           (["--batch-wait-ms", "-1"], "negative")):
        proc = subprocess.run([sys.executable, "-m", "runtime.cli", "serve", "--scheduler-mode", "mtp_batch",
                               *flags], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr


async def test_the_choices_of_one_request_prefill_its_prompt_once(batch_server, idle_server):
    """n = 3 joins the batch as one prefill row and two twins that copy its KV: greedy, the three
    answers are plain decode's, and the twins' prompt tokens all count as reused."""
    prompt = "Name three rivers of Europe, then say which is the longest.\n"  # in no other test: no cache hit
    async with aiohttp.ClientSession() as http:
        reply = await complete(http, batch_server.url, prompt, n=3)
        alone = await complete(http, idle_server.url, prompt, disable_mtp=True)
    assert [c["text"] for c in reply["choices"]] == [alone["choices"][0]["text"]] * 3
    prompt_tokens = reply["usage"]["prompt_tokens"]
    cached = [e["cached_tokens"] for i in (1, 2) for e in batch_server.events(f"{reply['id']}.{i}")
              if e["event"] == "prefilled"]
    assert cached == [prompt_tokens, prompt_tokens]
