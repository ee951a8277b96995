"""Seeing what speculation does, on a real `metrale serve`: /metrics against the receipts, decision
traces replayed, the dashboard JSON, and the live page in headless Chromium.

A server of this module's own decides by the MTP gate (no cost model) with 4-step windows, so a few
short requests cross several windows, probes and the entry pin; the shared server (the online
controller) is used for a controller trace.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.decisions import read_trace
from runtime.replay import replay
from runtime.replay_cli import main as replay_main
from tests.integration.conftest import ServerProcess, get_json

PROMPTS = ["Write a long story about a lighthouse keeper.", "List the planets of the solar system in order.",
           "Explain how a bicycle works, step by step."]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def gate_server(model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate-server")
    trace = tmp / "trace.jsonl"
    proc = ServerProcess(tmp, extra=("--spec-cost-model", "off", "--mtp-gate", "auto",
                                     "--gate-window-steps", "4", "--trace-file", str(trace)))
    proc.trace_file = trace
    yield proc
    proc.stop()


def chat(url: str, prompt: str, max_tokens: int = 12) -> dict:
    body = json.dumps({"model": "default", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def scrape(url: str) -> dict[tuple, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


def test_metrics_count_exactly_what_the_receipts_say(gate_server):
    before = scrape(gate_server.url)
    replies = [chat(gate_server.url, p) for p in PROMPTS]
    time.sleep(0.3)  # the streamer's last samples reach telemetry
    after = scrape(gate_server.url)
    assert all(r["choices"][0]["finish_reason"] == "length" for r in replies)  # every step emitted
    receipts = [r["usage"]["speculation"] for r in replies]

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    spec = "metrale:spec_decode_num"
    assert delta(f"{spec}_drafts_total") == sum(r["verify_steps"] for r in receipts) > 0
    assert delta(f"{spec}_draft_tokens_total") == sum(r["drafted_tokens"] for r in receipts)
    assert delta(f"{spec}_accepted_tokens_total") == sum(r["accepted_tokens"] for r in receipts)
    for position in range(3):
        expected = sum(r["accepted_by_position"][position] for r in receipts
                       if len(r["accepted_by_position"]) > position)
        assert delta(f"{spec}_accepted_tokens_per_pos_total", position=str(position)) == expected
    phase = "metrale_sched_phase_seconds_count"
    assert delta(phase, phase="step_mtp") == sum(r["verify_steps"] for r in receipts)
    assert delta(phase, phase="step_plain") == sum(r["plain_steps"] for r in receipts)
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert delta(f"metrale:{name}_seconds_count") == len(PROMPTS)
    steps = sum(r["verify_steps"] + r["plain_steps"] for r in receipts)
    assert delta("metrale:inter_token_latency_seconds_count") == steps
    assert total(after, "metrale:num_requests_running") == 0
    assert total(after, "metrale_speculation_decider", decider="gate") == 1


def test_a_recorded_trace_replays_to_every_decision_and_another_margin_differs(gate_server, tmp_path, capsys):
    chat(gate_server.url, PROMPTS[0], max_tokens=24)
    with urllib.request.urlopen(gate_server.url + "/v1/traces", timeout=5) as r:
        ring = r.read()
    header, steps = read_trace(ring.splitlines())
    drafter = gate_server.health()["scheduler"]["speculation"]["drafter"]
    assert header.gate.window_steps == 4 and header.drafter == drafter
    assert steps[0].step == 1 and {s.decision.decider for s in steps} == {"gate"}
    spec = [s for s in steps if s.ran == "mtp"]  # each speculative step says what its drafting took of it
    assert spec and all(0 < s.draft_s < s.wall_s for s in spec)
    assert all(s.draft_s == 0 and s.caught_up == 0 for s in steps if s.ran == "plain")
    same = replay(header, steps)
    assert same.actual.same == len(steps)  # every recorded decision, exactly
    assert (same.replayed.tokens, same.replayed.wall_s) == (same.actual.tokens, same.actual.wall_s)
    switched = steps[-1].decision.gate.state["switches"] > 0
    margin = 100.0 if switched else -0.99  # never switch, or switch as soon as both modes are measured
    other = replay(header, steps, margin=margin)
    assert other.actual.same < len(steps) and other.replayed.tokens != same.replayed.tokens
    assert other.replayed.tokens == pytest.approx(sum(r.delivered.tokens for r in other.steps))
    assert other.actual.tokens == same.actual.tokens  # what was delivered does not move
    # The trace file (--trace-file) holds the same decisions, and the command prints the totals.
    file_header, file_steps = read_trace(gate_server.trace_file.read_bytes().splitlines())
    assert file_header == header and [s.step for s in file_steps][:len(steps)] == [s.step for s in steps]
    plot = tmp_path / "replay.png"
    assert replay_main([str(gate_server.trace_file), "--gate-margin", str(margin), "--plot", str(plot)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "decisions_differ=" in last and "replayed_tok_s=" in last and plot.stat().st_size > 1000


def test_a_controller_trace_replays_exactly(idle_server):
    chat(idle_server.url, PROMPTS[2], max_tokens=16)
    with urllib.request.urlopen(idle_server.url + "/v1/traces", timeout=5) as r:
        header, steps = read_trace(r.read().splitlines())
    controlled = [s for s in steps if s.decision.decider == "controller"]
    assert controlled, "the shared server decides by the online controller"
    result = replay(header, controlled)
    assert result.actual.same == len(controlled)
    consulted = [s for s in controlled if any(s.decision.eligible)]
    assert consulted and all(s.decision.controller.verify for s in consulted)
    assert all(s.decision.controller is None for s in controlled if not any(s.decision.eligible))


def test_dashboard_json_has_every_block(gate_server):
    chat(gate_server.url, PROMPTS[1])
    d = get_json(gate_server.url + "/v1/dashboard")
    assert d["scheduler"]["mode"] == "serial" and d["decider"] == "gate" and d["gate"]["windows"] > 0
    assert d["requests"][0]["receipt"]["verify_steps"] + d["requests"][0]["receipt"]["plain_steps"] > 0
    assert d["series"] and d["series"][-1]["steps"] > 0 and d["distributions"]["ttft"]["count"] > 0
    assert d["acceptance"]["drafted_by_position"] and d["last_decision"]["decision"]["decider"] == "gate"


FIGURES = {"num_drafts": lambda d: d["acceptance"]["num_drafts"],
           "draft_tokens": lambda d: d["acceptance"]["draft_tokens"],
           "accepted_tokens": lambda d: d["acceptance"]["accepted_tokens"], "steps": lambda d: d["steps"],
           "ttft_count": lambda d: d["distributions"]["ttft"]["count"], "requests": lambda d: len(d["requests"])}


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: apt-get install chromium (Debian) to run the browser test")
def test_the_live_page_in_headless_chromium(gate_server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    load = threading.Thread(target=lambda: [chat(gate_server.url, p, max_tokens=20) for p in PROMPTS])
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(gate_server.url + "/dashboard")
            load.start()
            page.wait_for_function("document.querySelectorAll('[data-filled=\"false\"]').length === 0", timeout=90_000)
            load.join(120)
            shown = wait_until_page_matches(page, gate_server.url)
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        finally:
            browser.close()
    assert all(shown[k] == v for k, v in shown["expected"].items())
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def wait_until_page_matches(page, url: str, timeout: float = 15.0) -> dict:
    """Once idle, the page's figures equal /v1/dashboard's (the page updates once a second)."""
    deadline = time.monotonic() + timeout
    while True:
        d = get_json(url + "/v1/dashboard")
        expected = {k: str(int(f(d)) if isinstance(f(d), float) else f(d)) for k, f in FIGURES.items()}
        shown = {k: page.inner_text(f'[data-key="{k}"]') for k in FIGURES}
        rows = page.locator("[data-panel=requests] tr[data-request]").count()
        if (shown == expected and rows == len(d["requests"])) or time.monotonic() > deadline:
            return {**shown, "expected": expected}
        time.sleep(0.5)
