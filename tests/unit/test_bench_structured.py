"""bench structured's accounting, on made-up results (the bench itself runs the default model)."""

from types import SimpleNamespace

from runtime.bench.structured import FORCED, PLAIN, PLAIN_FORCED, SPEC, forwards, report
from runtime.messages import SpecReceipt


def result(tokens: int, seconds: float, plain: int, verify: int, drafted=0, accepted=0):
    receipt = SpecReceipt(plain_steps=plain, verify_steps=verify, drafted_tokens=drafted, accepted_tokens=accepted)
    return SimpleNamespace(tokens=[1] * tokens, seconds=seconds, receipt=receipt)


def test_forwards_count_the_prefill_and_every_step_and_the_last_line_reports_forced_drafts(capsys):
    assert forwards(result(10, 1.0, plain=4, verify=2)) == 7
    runs = {PLAIN: [result(40, 4.0, 39, 0)], SPEC: [result(40, 3.0, 9, 10, 30, 20)],
            FORCED: [result(40, 2.0, 4, 10, 40, 25)], PLAIN_FORCED: [result(40, 2.5, 12, 8)]}
    assert report(runs, True, "mtp", 3) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "structured_speedup=2.000 forwards_per_token=0.375 plain_forced_speedup=1.600 valid=1"
    assert report(runs, False, "mtp", 3) == 1
