"""structlog set-up: one JSON object per line on stdout (msgspec-encoded), or console output.

Called from ``create_app``, never at import time. The request middleware writes one
canonical line per request; nothing logs document text or credentials.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor

__all__ = ("configure_logging",)

_encoder = msgspec.json.Encoder(enc_hook=str)


def _dumps(event: EventDict, **_: Any) -> bytes:
    # structlog's JSONRenderer passes default=...; msgspec wants enc_hook instead.
    return _encoder.encode(event)


def configure_logging(level: str = "INFO", *, fmt: str = "json", cache: bool = True) -> None:
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        tail: list[Processor] = [
            # No frame locals: they could hold document text or credentials.
            structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False)),
            structlog.processors.JSONRenderer(serializer=_dumps),
        ]
        factory: Any = structlog.BytesLoggerFactory(sys.stdout.buffer)
    else:
        tail = [structlog.dev.ConsoleRenderer(colors=False)]
        factory = structlog.PrintLoggerFactory(sys.stdout)
    structlog.configure(
        processors=shared + tail,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level]),
        logger_factory=factory,
        cache_logger_on_first_use=cache,
    )
