"""Trace lines go to the stderr of the moment: a stream closed since configure() breaks nothing."""

import io
import sys

import structlog

from runtime import tracing


def test_a_closed_stream_from_an_earlier_configure_breaks_no_later_log(monkeypatch):
    old = io.StringIO()
    monkeypatch.setattr(sys, "stderr", old)
    tracing.configure("json")
    old.close()  # what a test's captured output does once the test ends
    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    structlog.get_logger().bind(actor="x").error("still_logged", n=1)
    assert '"event": "still_logged"' in now.getvalue()
