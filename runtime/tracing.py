"""structlog set-up: one line per actor event, JSON by default, to stderr."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(log_format: str = "json", level: str = "info") -> None:
    renderer = (structlog.processors.JSONRenderer() if log_format == "json"
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=_StderrLogger,
        cache_logger_on_first_use=False,
    )


class _StderrLogger:
    """Writes each line to whatever sys.stderr is at that moment. A stream captured at configure time
    can be closed later (a test's captured output is), and a log call that raises inside an actor's
    error handler would kill the actor."""

    def __init__(self, *args) -> None:
        pass

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warning = warn = error = critical = exception = fatal = failure = msg
