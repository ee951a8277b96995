"""Fuzzing the live server: schemathesis against its own /openapi.json, hypothesis WebSocket frames.

Bounded for CI (FUZZ_EXAMPLES cases per operation, max_tokens capped at 4 so each case is short);
`METRALE_FUZZ_EXAMPLES=N` runs more. Every response must match the document, no 5xx, every error
an OpenAI-style error object, and the server still answers a normal request afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import hypothesis.strategies as st
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.integration.conftest import ServerProcess

FUZZ_EXAMPLES = int(os.environ.get("METRALE_FUZZ_EXAMPLES", "60"))
GOOD = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
VOCAB = [0]  # the served model's vocabulary size, read by the fuzz server's fixture


@pytest.fixture(scope="module")
def fuzz_server(model_dir, tmp_path_factory):
    VOCAB[0] = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    proc = ServerProcess(tmp_path_factory.mktemp("fuzz"), max_pending=8, extra=("--max-tokens-limit", "4"))
    yield proc
    assert "Traceback" not in proc.log(), proc.log()[-3000:]  # no handler crashed, even when answered
    proc.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    config = schemathesis.config.SchemathesisConfig.from_dict({
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
        "checks": {"ignored_auth": {"enabled": False}},  # no --api-key on this server
    })
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json", config=config)


@schemathesis.hook
def filter_body(ctx, body) -> bool:
    # JSON Schema counts 1.0 as an integer; msgspec (and so this server) refuses it for an int field.
    # A logit_bias id past the model's vocabulary is a 400 the document cannot state (it depends on
    # the model served): such a body is not schema-valid input for this server.
    return not _integral_float(body) and not _past_vocabulary(body)


def _past_vocabulary(body) -> bool:
    bias = body.get("logit_bias") if isinstance(body, dict) else None
    return isinstance(bias, dict) and any(k.isascii() and k.isdigit() and int(k) >= VOCAB[0] for k in bias)


def _integral_float(value) -> bool:
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, dict):
        return any(map(_integral_float, value.values()))
    if isinstance(value, list):
        return any(map(_integral_float, value))
    return False


def openai_error(ctx, response, case) -> None:
    """Every error, documented status or not, is {"error": {message, type, param, code}}; /v1/messages
    answers in Anthropic's shape, {"type": "error", "error": {type, message}}."""
    if response.status_code >= 400:
        body = json.loads(response.content)
        error = body["error"]
        if case.path == "/v1/messages" and body.get("type") == "error":
            assert error["message"] and error["type"]
            return
        assert error["message"] and error["type"] and error["code"] == response.status_code


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_http_api_matches_its_document(fuzz_server, api_schema, mode):
    # A WebSocket is no HTTP operation to fuzz: its frames are fuzzed below.
    cases = api_schema.exclude(path="/v1/ws").as_strategy(mode)

    @given(data=st.data())
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(data):
        data.draw(cases).call_and_validate(base_url=fuzz_server.url, timeout=30, additional_checks=[openai_error])

    check()


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
                     max_leaves=12)
_fields = st.fixed_dictionaries({"type": st.sampled_from(["generate", "cancel", "other"]), "id": st.text(max_size=8)},
                                optional={"prompt": st.text(max_size=30), "max_tokens": st.integers(-2, 6),
                                          "messages": _json, "temperature": _json, "stop": _json, "extra": _json})
FRAMES = st.lists(st.one_of(_fields.map(json.dumps), _json.map(json.dumps), st.text(max_size=40)), min_size=1, max_size=6)


@given(frames=FRAMES)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_websocket_frames_get_answers_or_errors(fuzz_server, frames):
    asyncio.run(_send_frames(fuzz_server.url, frames))


async def _send_frames(url: str, frames: list[str]) -> None:
    """Each frame gets an error, or (a valid generate) tokens and one end; the socket stays open."""
    async with aiohttp.ClientSession() as http, http.ws_connect(url + "/v1/ws") as ws:
        for frame in frames:
            await ws.send_str(frame)
        await ws.send_json({"type": "generate", "id": "\x00last", "prompt": "Hi", "max_tokens": 1})
        async with asyncio.timeout(60):
            while True:
                msg = await ws.receive_json()
                assert msg["type"] in ("tokens", "done", "error"), msg
                if msg["type"] == "error":
                    assert msg["error"]["message"] and msg["error"]["code"] < 500, msg
                if msg.get("id") == "\x00last" and msg["type"] in ("done", "error"):
                    assert msg["type"] == "done", msg
                    return


async def test_the_server_still_serves_after_fuzzing(fuzz_server):
    async with aiohttp.ClientSession() as http:
        async with http.post(fuzz_server.url + "/v1/chat/completions", json=GOOD) as r:
            assert r.status == 200, await r.text()
        health = fuzz_server.health()
    assert health["status"] == "ok"
