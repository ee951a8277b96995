"""Hostile input on a real server on loopback (in process, tiny model, small limits): oversized
bodies, abusive headers, paths and methods, and WebSocket abuse each get a clear refusal, and
the server answers a normal request afterwards."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.integration.inprocess import PROMPT, Served, tiny_model

LIMIT = 4096  # max_body_bytes of the server under test
GOOD = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


async def still_serves(served: Served) -> None:
    async with served.http.post(served.url + "/v1/completions", json=GOOD) as r:
        assert r.status == 200, await r.text()


async def raw(served: Served, data: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (no client tidies them up); the status and whatever came back."""
    port = int(served.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = await asyncio.wait_for(reader.read(1 << 16), 10)
    writer.close()
    return int(out.split(b" ", 2)[1]), out


async def test_oversized_bodies_get_413_whether_declared_or_chunked(model_dir):
    async with Served(model_dir, max_body_bytes=LIMIT) as served:
        big = {**GOOD, "prompt": "x" * (2 * LIMIT)}
        async with served.http.post(served.url + "/v1/completions", json=big) as r:
            assert r.status == 413 and (await r.json())["error"]["code"] == 413

        async def chunks():
            for _ in range(8):
                yield b" " * LIMIT  # no Content-Length: the limit holds while reading
        async with served.http.post(served.url + "/v1/completions", data=chunks(),
                                    headers={"Content-Type": "application/json"}) as r:
            assert r.status == 413 and (await r.json())["error"]["code"] == 413
        await still_serves(served)


async def test_abusive_headers_paths_and_methods_are_refused(model_dir):
    async with Served(model_dir, max_body_bytes=LIMIT) as served:
        status, _ = await raw(served, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
        assert status in (400, 431)
        status, _ = await raw(served, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert 400 <= status < 500
        status, _ = await raw(served, b"NOT AN HTTP REQUEST\r\n\r\n")
        assert status == 400
        for path in ("/%2e%2e/%2e%2e/etc/passwd", "/v1/models%00", "/v1//models", "/v1/chat/completions/../../x"):
            status, out = await raw(served, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            assert status in (400, 404), (path, out)
            assert status == 400 or b'"error"' in out, (path, out)  # a routed 404 is an OpenAI error object
        async with served.http.put(served.url + "/v1/completions") as r:
            assert r.status == 405 and "POST" in r.headers["Allow"] and (await r.json())["error"]["code"] == 405
        async with served.http.post(served.url + "/v1/completions", data=b"\xff\xfe\x00",
                                    headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
        await still_serves(served)


async def test_websocket_abuse_gets_error_frames_or_a_close(model_dir):
    async with Served(model_dir, max_body_bytes=LIMIT, ws_max_open=2) as served:
        async with served.http.ws_connect(served.url + "/v1/ws") as ws:
            await ws.send_bytes(b"\x00\x01")
            assert (await ws.receive_json())["error"]["message"].startswith("binary frames")
            await ws.send_json({"type": "cancel", "id": "nobody"})
            error = (await ws.receive_json())["error"]
            assert error["param"] == "id" and "no request" in error["message"]
            long = {"type": "generate", "prompt": PROMPT, "max_tokens": 400}
            for cid in ("a", "b", "c"):  # the third is one more than this socket may hold open
                await ws.send_json({**long, "id": cid})
            frames = []
            while not any(f["type"] == "error" for f in frames):
                frames.append(await ws.receive_json())
            error = next(f for f in frames if f["type"] == "error")
            assert error["id"] == "c" and error["error"]["code"] == 429
            await ws.send_json({"type": "generate", "id": "x" * 300, "prompt": PROMPT})
            while (msg := await ws.receive_json())["type"] != "error":
                pass
            assert msg["error"]["param"] == "id"  # ids are bounded too
        async with served.http.ws_connect(served.url + "/v1/ws") as ws:
            await ws.send_str("[" * (2 * LIMIT))  # larger than a message may be
            closing = await ws.receive()
            assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        await still_serves(served)
