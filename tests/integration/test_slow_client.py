"""A client that stops reading, against the real server on 127.0.0.1 (in process, a tiny model):
a raw socket with a small receive buffer sends a long streamed request, over SSE or WebSocket, and
never reads. Other requests are served meanwhile; after --slow-client-timeout the stalled request
is cancelled (slow_client) with exactly one terminal event and its connection is dropped."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time

import pytest

from tests.integration.inprocess import PROMPT, Served, every_event

TIMEOUT_S, LONG = 1.0, 4000  # LONG tokens of output take the tiny model ~7 s: far past the stall
BUFFER = 16384  # the server buffers ~3x this for a client: a few hundred tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import save_tiny_dir

    folder = save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=3)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))  # room for LONG
    return folder


def stalled_socket(url: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    return sock


def send_sse_request(sock: socket.socket) -> None:
    body = json.dumps({"prompt": PROMPT, "max_tokens": LONG, "temperature": 0, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)


def send_ws_request(sock: socket.socket) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(1)  # one byte at a time: nothing after the handshake is read
    assert reply.startswith(b"HTTP/1.1 101"), reply
    payload = json.dumps({"type": "generate", "id": "a", "prompt": PROMPT, "max_tokens": LONG,
                          "temperature": 0}).encode()
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    sock.sendall(bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + mask + masked)


async def others_are_served(served: Served) -> float:
    """A JSON and an SSE request, start to end; the seconds they took."""
    started = time.monotonic()
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    async with served.http.post(served.url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
    async with served.http.post(served.url + "/v1/completions", json={**body, "stream": True}) as r:
        lines = [line async for line in r.content if line.startswith(b"data: ")]
    assert lines[-1].strip() == b"data: [DONE]"
    return time.monotonic() - started


async def wait_for_event(logs: list[dict], name: str, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [e for e in logs if e["event"] == name]
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {name} event in {seconds} s")


def drained_to_close(sock: socket.socket) -> bool:
    """Read what the buffers held: the server has dropped the connection (EOF or reset)."""
    sock.settimeout(5.0)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize("send", [send_sse_request, send_ws_request], ids=["sse", "websocket"])
async def test_a_client_that_stops_reading_is_cancelled_and_stalls_no_one(model_dir, send):
    with every_event() as logs:
        async with Served(model_dir, slow_client_timeout=TIMEOUT_S, stream_buffer_bytes=BUFFER) as served:
            sock = stalled_socket(served.url)
            try:
                await asyncio.to_thread(send, sock)
                await wait_for_event(logs, "first_token", 5)
                assert await asyncio.wait_for(others_are_served(served), 5) < 5
                stalled = await wait_for_event(logs, "slow_client", 15)
                assert await asyncio.to_thread(drained_to_close, sock)
            finally:
                sock.close()
            rid = stalled["request_id"]
            await asyncio.sleep(0.2)  # its Cancelled reaches the streamer
    ends = [e for e in logs if e.get("request_id") == rid and e.get("actor") == "scheduler"
            and e["event"] in ("finished", "cancelled", "failed")]
    assert [(e["event"], e.get("reason")) for e in ends] == [("cancelled", "slow_client")], ends
    assert ends[0]["completion_tokens"] < LONG  # cut short, not run to its end
    assert not [e for e in logs if e["event"] in ("duplicate_terminal", "handler_failed")]
