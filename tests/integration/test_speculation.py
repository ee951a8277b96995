"""Speculation on the default model: greedy output is byte-identical to plain decode.

Engine level: every drafter (n-gram, the model as its own draft model, an MTP head) at K = 1..8.
Server level: a server forced to speculate answers exactly what plain decode answers, with receipts.
"""

import json
import urllib.request

import pytest

from tests.integration.conftest import ServerProcess

PROMPTS = {
    "code": "<|im_start|>user\nWrite a Python function that returns the squares of a list.<|im_end|>\n<|im_start|>assistant\n",
    "chat": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "repeat": "one two three one two three one two",
}
# Every K in 1..8 once; the untrained MTP head (its full LM head per draft) is the slowest, so it
# takes one small K here (tests/unit covers it at K = 1, 2, 4, 8 on a tiny model). The trained head
# shipped for the default model (reduced draft vocabulary) runs at K = 1, 2 and 4.
DRAFTER_KS = [("ngram", 1), ("ngram", 4), ("ngram", 6), ("ngram", 7), ("draft-model", 2), ("draft-model", 5),
              ("draft-model", 8), ("mtp", 3), ("fused-mtp", 3), ("shipped-mtp", 1), ("shipped-mtp", 2),
              ("shipped-mtp", 4)]
N = 24


@pytest.fixture(scope="module")
def target(model_dir):
    from kernels.engine import Engine
    from kernels.loader import load
    from runtime.text import TextCodec

    model, codec = load(model_dir).model, TextCodec(model_dir)
    plain = {name: run(Engine(model), codec.encode(text), 0, "none") for name, text in PROMPTS.items()}
    return model, codec, plain


def run(engine, ids, k, kind):
    from kernels.ngram import propose_ngram

    out = [engine.prefill("s", ids, 0.0, 1.0, None, k == 0)]
    while len(out) < N:
        drafts = [] if k == 0 else propose_ngram(ids + out, k) if kind == "ngram" else engine.propose("s", k)[0]
        if not drafts:
            out += engine.decode(["s"], [k == 0])
            continue
        accepted, emitted = engine.verify("s", drafts, kind != "ngram")
        engine.rollback("s", len(drafts), accepted, emitted)
        out += emitted
    engine.release("s")
    return out[:N]


def engine_for(kind, model, model_dir):
    import mlx.core as mx

    from kernels.drafters import DraftModelDrafter, MtpDrafter
    from kernels.engine import Engine
    from kernels.heads import build_drafter
    from kernels.mtp_head import MTPConfig, MTPHead

    if kind == "shipped-mtp":
        return Engine(model, drafter=build_drafter("mtp", model, model_dir, None, None)[1])
    if kind == "draft-model":
        return Engine(model, drafter=DraftModelDrafter(model))
    if kind in ("mtp", "fused-mtp"):  # an untrained head of the model's shape: poor drafts, same output
        mx.random.seed(0)
        layers = (2, 15) if kind == "fused-mtp" else ()  # fed low and middle layers too (EAGLE-3 style)
        head = MTPHead(MTPConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                                 intermediate_size=1536, rope_theta=100000.0, feature_layers=layers))
        return Engine(model, drafter=MtpDrafter(head, model))
    return Engine(model)


def test_the_forward_that_feeds_a_fused_head_gives_the_stock_logits(target, model_dir):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from kernels.features import body
    from kernels.loader import output_head

    model, codec, _ = target
    stock, mine = make_prompt_cache(model), make_prompt_cache(model)
    ids = codec.encode(PROMPTS["chat"])
    for tokens in (mx.array([ids]), mx.array([[ids[-1]]]), mx.array([ids[:4]])):  # prefill, step, verify
        final, _ = body(model, tokens, mine, (2, 15))
        assert mx.array_equal(output_head(model)(final), model(tokens, cache=stock))


@pytest.mark.parametrize("kind,k", DRAFTER_KS, ids=[f"{d}-K{k}" for d, k in DRAFTER_KS])
def test_greedy_speculation_is_byte_identical_on_the_default_model(target, model_dir, kind, k):
    model, codec, plain = target
    for name, text in PROMPTS.items():
        spec = run(engine_for(kind, model, model_dir), codec.encode(text), k, kind)
        assert codec.decode(spec) == codec.decode(plain[name]), name
        assert spec == plain[name], name


def post(url, body):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def forced_server(model_dir, tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("forced"),
                         extra=("--drafter", "ngram", "--mtp-gate", "force", "--num-draft-tokens", "4",
                                "--spec-cost-model", "off"))
    yield proc
    proc.stop()


def test_forced_speculation_server_matches_plain_decode(forced_server, idle_server):
    for text in PROMPTS.values():
        body = {"prompt": text, "max_tokens": 48, "temperature": 0}
        spec = post(forced_server.url, body)
        plain = post(idle_server.url, {**body, "disable_mtp": True})
        assert spec["choices"][0]["text"] == plain["choices"][0]["text"]
        receipt, plain_receipt = spec["usage"]["speculation"], plain["usage"]["speculation"]
        assert plain_receipt["verify_steps"] == 0 and plain_receipt["drafted_tokens"] == 0
        assert receipt["verify_steps"] > 0 and receipt["drafted_tokens"] >= receipt["accepted_tokens"]
        assert sum(receipt["accepted_by_position"]) == receipt["accepted_tokens"]
    health = json.loads(urllib.request.urlopen(forced_server.url + "/health").read())
    assert health["scheduler"]["speculation"]["gate_setting"] == "force"


def test_disable_mtp_turns_speculation_off_for_one_request(forced_server):
    body = {"prompt": PROMPTS["repeat"], "max_tokens": 16, "temperature": 0}
    assert post(forced_server.url, {**body, "disable_mtp": True})["usage"]["speculation"]["verify_steps"] == 0
    assert post(forced_server.url, body)["usage"]["speculation"]["verify_steps"] > 0


def test_seeded_sampling_repeats_with_speculation_forced(forced_server):
    body = {"prompt": PROMPTS["repeat"], "max_tokens": 16, "temperature": 0.9, "seed": 11}
    first, second = post(forced_server.url, body), post(forced_server.url, body)
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert first["usage"]["speculation"]["verify_steps"] > 0


def test_the_default_model_finds_its_shipped_head(model_dir):
    from kernels.heads import SHIPPED, build_drafter, find_mtp_head
    from kernels.loader import load

    head = find_mtp_head(model_dir)
    assert head is not None and head.parent == SHIPPED
    kind, drafter = build_drafter("auto", load(model_dir).model, model_dir, None, None)
    assert kind == "mtp" and drafter.head.reduced


@pytest.fixture(scope="module")
def forced_mtp_server(model_dir, tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("forced-mtp"), extra=("--mtp-gate", "force", "--spec-cost-model", "off"))
    yield proc
    proc.stop()


def test_served_with_no_drafter_flag_the_shipped_head_drafts_and_output_matches_plain(forced_mtp_server, idle_server):
    health = json.loads(urllib.request.urlopen(forced_mtp_server.url + "/health").read())
    assert health["scheduler"]["speculation"]["drafter"] == "mtp"
    accepted = 0
    for text in PROMPTS.values():
        body = {"prompt": text, "max_tokens": 40, "temperature": 0}
        spec = post(forced_mtp_server.url, body)
        plain = post(idle_server.url, {**body, "disable_mtp": True})
        assert spec["choices"][0]["text"] == plain["choices"][0]["text"]
        receipt = spec["usage"]["speculation"]
        assert receipt["verify_steps"] > 0
        accepted += receipt["accepted_tokens"]
    assert accepted > 0  # a trained head's drafts are taken, not only verified
