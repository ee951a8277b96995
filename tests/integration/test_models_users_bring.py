"""A model users bring: a 4-bit copy of the default model under another name serves, /health reports
its quantization, and the MTP head shipped for the base is found for it and drafts losslessly."""

import json
import subprocess
import sys
import urllib.request

import pytest

from tests.integration.conftest import ServerProcess

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def q4_copy(model_dir, tmp_path_factory):
    copy = tmp_path_factory.mktemp("brought") / "my-smol-4bit"
    subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(model_dir),
                    "--mlx-path", str(copy), "-q"], check=True, capture_output=True, timeout=120)
    return copy


@pytest.fixture(scope="module")
def q4_server(q4_copy, tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("q4"), extra=("--model", str(q4_copy), "--mtp-gate", "force",
                                                               "--spec-cost-model", "off"))
    yield proc
    proc.stop()


def mlx_lm_answer(model_path, max_tokens: int) -> str:
    from mlx_lm import generate, load

    model, tokenizer = load(str(model_path))
    prompt = tokenizer.apply_chat_template(CAPITAL, add_generation_prompt=True, tokenize=False)
    return generate(model, tokenizer, prompt, max_tokens=max_tokens)


def chat(url: str, **extra) -> dict:
    body = json.dumps({"messages": CAPITAL, "max_tokens": 8, "temperature": 0, **extra}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_a_quantized_renamed_copy_reports_its_dtype_and_gets_the_shipped_head(q4_server, q4_copy):
    health = q4_server.health()
    assert health["model"] == "my-smol-4bit"
    assert health["dtype"] == "4-bit (group 64), float32 activations"
    assert health["quantization"] == {"bits": 4, "group_size": 64, "mode": "affine"}
    assert health["scheduler"]["speculation"]["drafter"] == "mtp"
    spec, plain = chat(q4_server.url), chat(q4_server.url, disable_mtp=True)
    assert spec["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    # 4 bits garble a 135M model's answer; it must be the one mlx-lm gives for the same copy.
    assert spec["choices"][0]["message"]["content"].lstrip() == mlx_lm_answer(q4_copy, 8).lstrip()
    assert spec["usage"]["speculation"]["verify_steps"] > 0
