"""The telemetry actor behind a real scheduler (scripted owner, real drafter, verifier and streamer):
its Prometheus text parses, the spec_decode counters and latency counts equal the receipts, and
the decision trace replays to the same decisions."""

import asyncio
import io

from prometheus_client.parser import text_string_to_metric_families

from actors.drafter import Drafter
from actors.scheduler import Scheduler
from actors.streamer import Streamer
from actors.telemetry import Telemetry
from actors.verifier import Verifier
from runtime.decisions import TraceHeader, encode_line, read_trace
from runtime.gate import GateConfig
from runtime.messages import Admitted, Finished, SamplingParams, Sample, Snapshot, Subscribe
from runtime.modes import SerialMode
from runtime.observe import DescribeTraffic, ExportTraces
from runtime.replay import replay
from runtime.speculation import SpeculationPolicy
from tests.actors.fakes import CharCodec, ScriptedSpecOwner
from tests.unit.test_speculation_policy import _table, controlled

SCRIPT = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]
GATE = GateConfig(window_steps=2, dwell_windows=1)


async def serve(policy, requests: int = 3):
    """Run `requests` requests one after another; the receipts and the running telemetry actor."""
    owner = ScriptedSpecOwner({f"r{i}": SCRIPT for i in range(requests)})
    telemetry = Telemetry()
    streamer = Streamer(None, telemetry)
    drafter, verifier = Drafter("ngram", owner, telemetry), Verifier(owner, telemetry)
    scheduler = Scheduler(SerialMode(), owner, streamer, telemetry, CharCodec(), policy, drafter, verifier)
    actors = [telemetry, owner, streamer, drafter, verifier, scheduler]
    for actor in actors:
        actor.start()
    receipts = []
    for i in range(requests):
        queue = asyncio.Queue()
        await streamer.tell(Subscribe(request_id=f"r{i}", queue=queue))
        await scheduler.tell(Admitted(request_id=f"r{i}", prompt_ids=(1, 2, 3),
                                      params=SamplingParams(max_tokens=len(SCRIPT)), submitted_at=0.0))
        async with asyncio.timeout(5):
            while not isinstance(event := await queue.get(), Finished):
                pass
        receipts.append(event.usage.speculation)
    return receipts, telemetry, actors


async def stop(actors):
    for actor in reversed(actors):
        await actor.close()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, family: str, sample: str, **labels) -> float:
    return sum(s.value for s in fams[family].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


async def test_metrics_parse_and_equal_the_receipts():
    receipts, telemetry, actors = await serve(SpeculationPolicy("ngram", 3, "auto", gate_config=GATE))
    await asyncio.sleep(0.05)  # the streamer's last samples
    fams = families((await telemetry.ask(Snapshot(format="prometheus"))).decode())
    await stop(actors)
    spec = "metrale:spec_decode_num"
    assert value(fams, f"{spec}_drafts", f"{spec}_drafts_total", drafter="ngram") == \
        sum(r.verify_steps for r in receipts) > 0
    assert value(fams, f"{spec}_draft_tokens", f"{spec}_draft_tokens_total") == sum(r.drafted_tokens for r in receipts)
    assert value(fams, f"{spec}_accepted_tokens", f"{spec}_accepted_tokens_total") == \
        sum(r.accepted_tokens for r in receipts) > 0
    for position in range(3):
        expected = sum(r.accepted_by_position[position] for r in receipts if len(r.accepted_by_position) > position)
        assert value(fams, f"{spec}_accepted_tokens_per_pos", f"{spec}_accepted_tokens_per_pos_total",
                     position=str(position)) == expected
    phase = "metrale_sched_phase_seconds"
    assert value(fams, phase, f"{phase}_count", phase="step_mtp") == sum(r.verify_steps for r in receipts)
    assert value(fams, phase, f"{phase}_count", phase="step_plain") == sum(r.plain_steps for r in receipts)
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        family = f"metrale:{name}_seconds"
        assert value(fams, family, f"{family}_count") == len(receipts)
    itl = "metrale:inter_token_latency_seconds"
    assert value(fams, itl, f"{itl}_count") == sum(r.verify_steps + r.plain_steps for r in receipts)
    assert fams["metrale:num_requests_running"].type == "gauge"
    assert fams["metrale_gate_serial_tok_s"].samples[0].value > 0


async def test_health_keeps_its_keys_and_unknown_samples_get_a_family():
    telemetry = Telemetry()
    telemetry.start()
    await telemetry.tell(Sample(name="requests_total", value=1, labels=(("outcome", "cancelled"),)))
    await telemetry.tell(Sample(name="something_new", value=2.5, kind="gauge", labels=(("k", "v"),)))
    await telemetry.tell(Sample(name="requests_total", value=1, labels=(("wrong", "label"),)))  # refused, logged
    await telemetry.tell(Sample(name="sched_phase_seconds", value=0.05, kind="observe", labels=(("phase", "p"),)))
    view = await telemetry.ask(Snapshot())
    text = (await telemetry.ask(Snapshot(format="prometheus"))).decode()
    await telemetry.close()
    assert view["counters"] == {"requests_total{outcome=cancelled}": 1.0}
    assert view["gauges"] == {"something_new{k=v}": 2.5}
    assert view["summaries"]["sched_phase_seconds{phase=p}"] == {"count": 1, "sum": 0.05, "max": 0.05}
    assert "# TYPE metrale_requests_total counter" in text and 'metrale_something_new{k="v"} 2.5' in text


async def test_gate_trace_replays_to_the_same_decisions_and_another_margin_differs():
    receipts, telemetry, actors = await serve(SpeculationPolicy("ngram", 3, "auto", gate_config=GATE), requests=4)
    records = await telemetry.ask(ExportTraces())
    traffic = await telemetry.ask(DescribeTraffic())
    await stop(actors)
    header = TraceHeader(drafter="ngram", num_draft_tokens=3, gate=GATE)
    header, steps = read_trace(io.BytesIO(b"".join([encode_line(header), *records])))
    assert len(steps) == sum(r.verify_steps + r.plain_steps for r in receipts)
    same = replay(header, steps)
    assert same.actual.same == same.actual.steps == len(steps)
    assert (same.replayed.tokens, same.replayed.wall_s) == (same.actual.tokens, same.actual.wall_s)
    switched = steps[-1].decision.gate.state["switches"] > 0
    other = replay(header, steps, margin=100.0 if switched else -0.99)  # never switch, or switch at once
    assert other.actual.same < len(steps) and other.replayed.tokens != same.replayed.tokens
    assert other.replayed.tokens == sum(r.delivered.tokens for r in other.steps)
    assert traffic["requests"][0]["receipt"]["verify_steps"] == receipts[-1].verify_steps
    assert traffic["acceptance"]["accepted_tokens"] == sum(r.accepted_tokens for r in receipts)


async def test_controller_trace_replays_and_an_objective_changes_it():
    policy = controlled("auto", _table([10, 11, 12, 13], 0.6))
    receipts, telemetry, actors = await serve(policy, requests=2)
    _, records = read_trace(await telemetry.ask(ExportTraces()))
    await stop(actors)
    header = TraceHeader(drafter="ngram", num_draft_tokens=3, slack=0.1, mtp_max_seqs=32)
    assert {r.decision.decider for r in records} == {"controller"}
    same = replay(header, list(records))
    assert same.actual.same == len(records)
    assert any(r.decision.controller.seqs[0].mean for r in records)
