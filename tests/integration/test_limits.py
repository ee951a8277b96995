"""The wire limits of runtime/protocol.py on the real server on 127.0.0.1 (in process, a tiny
model): too many messages, too many or too long stop strings each get a 400 naming the field."""

from __future__ import annotations

import pytest

from runtime.protocol import MAX_MESSAGES, MAX_STOP_CHARS, MAX_STOPS
from tests.integration.inprocess import PROMPT, Served, tiny_model

CASES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t3"}] * (MAX_MESSAGES + 1)}, "messages"),
    ("/v1/completions", {"prompt": PROMPT, "stop": ["t1"] * (MAX_STOPS + 1)}, "stop"),
    ("/v1/completions", {"prompt": PROMPT, "stop": "x" * (MAX_STOP_CHARS + 1)}, "stop"),
    ("/v1/completions", {"prompt": PROMPT, "stop": ["t1", "x" * (MAX_STOP_CHARS + 1)]}, "stop[1]"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


async def test_counts_and_lengths_beyond_the_limits_get_a_400_naming_the_field(model_dir):
    async with Served(model_dir) as served:
        for path, body, param in CASES:
            async with served.http.post(served.url + path, json={**body, "max_tokens": 2}) as r:
                error = (await r.json())["error"]
            assert r.status == 400 and error["param"] == param and error["type"] == "invalid_request_error", error
        async with served.http.post(served.url + "/v1/completions",
                                    json={"prompt": PROMPT, "stop": ["t1"] * MAX_STOPS, "max_tokens": 2}) as r:
            assert r.status == 200  # at the limit is fine
