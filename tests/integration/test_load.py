"""Load on the real server (mtp_batch, 16 active, the default admission limits): a burst of 64
clients, some dropping their SSE stream or cancelling over WebSocket, loses nothing, hangs nowhere,
gets no 5xx and, at the default pending limit, no 429 (`metrale bench load` is the long version)."""

import asyncio

from runtime.bench.load import count, drive
from runtime.config import AdmissionConfig
from tests.integration.conftest import ServerProcess

CLIENTS, REQUESTS = 64, 128


async def test_a_burst_of_64_clients_queues_and_every_admitted_request_ends_once(model_dir, tmp_path):
    server = ServerProcess(tmp_path, max_pending=AdmissionConfig().max_pending,
                           extra=("--scheduler-mode", "mtp_batch", "--max-active-requests", "16"))
    try:
        outcomes = await drive(server.url, CLIENTS, REQUESTS, seed=1, deadline=120)
        await asyncio.sleep(1.0)  # the last disconnects' cancellations reach the trace log
        counts = count(outcomes, server.log())
    finally:
        server.stop()
    assert counts["admitted"] == REQUESTS and counts["rejected_429"] == 0, counts
    assert counts["lost"] == counts["hung"] == counts["unexpected_5xx"] == 0, counts
    assert counts["cancelled"] > 0 and counts["finished"] > 0, counts  # the mix did drop and cancel some


async def test_an_injected_owner_fault_mid_load_fails_only_its_step_and_is_counted_apart(model_dir, tmp_path):
    server = ServerProcess(tmp_path, max_pending=AdmissionConfig().max_pending,
                           extra=("--scheduler-mode", "mtp_batch", "--max-active-requests", "16",
                                  "--fault-after-steps", "6"))
    try:
        outcomes = await drive(server.url, 32, 64, seed=2, deadline=120)
        await asyncio.sleep(1.0)
        counts = count(outcomes, server.log())
        assert server.health()["status"] == "ok"  # the owner failed one step, not the server
    finally:
        server.stop()
    assert counts["faults"] == 1 and counts["injected_5xx"] >= 1, counts
    assert counts["lost"] == counts["hung"] == counts["unexpected_5xx"] == 0, counts
