"""structlog set-up: one JSON object per line on stdout (msgspec-encoded), or console output.

Called from ``create_app``, never at import time. The request middleware writes one
canonical line per request; nothing logs document text or credentials.

Third-party libraries log through the standard library (uvicorn, huggingface_hub,
transformers, vLLM) or ``warnings``: the root logger gets one handler whose formatter is
structlog's :class:`~structlog.stdlib.ProcessorFormatter` with the same renderer, so with
``format = "json"`` every line on stdout is one JSON object, theirs included. Libraries that
install their own handlers (transformers, huggingface_hub, vLLM) are made to propagate to it
instead (:func:`adopt_library_loggers`, called again after an engine imports them); vLLM's
engine-core processes configure logging from the file named by ``VLLM_LOGGING_CONFIG_PATH``,
which points at the same formatter.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from typing import Any

import msgspec
import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor

__all__ = ("adopt_library_loggers", "configure_logging", "stdlib_formatter")

_encoder = msgspec.json.Encoder(enc_hook=str)
# Libraries that attach handlers of their own (plain text on stderr) instead of propagating.
_LIBRARY_LOGGERS = ("transformers", "huggingface_hub", "vllm", "uvicorn", "granian", "httpx", "torch")
# Below DEBUG the hub's per-attempt retry warnings are noise: the load error keeps the cause.
_QUIET_LOGGERS = ("huggingface_hub.utils._http", "httpx", "httpcore")
_configured = False


def _dumps(event: EventDict, **_: Any) -> bytes:
    # structlog's JSONRenderer passes default=...; msgspec wants enc_hook instead.
    return _encoder.encode(event)


def _dumps_str(event: EventDict, **_: Any) -> str:
    return _encoder.encode(event).decode()


def _shared() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def _exceptions() -> Processor:
    # No frame locals: they could hold document text or credentials.
    return structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))


def _console() -> Processor:
    # structlog's console default is rich's traceback with frame locals (the request scope with
    # its Authorization header, the documents): the plain traceback instead.
    return structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)


def stdlib_formatter(fmt: str = "json") -> logging.Formatter:
    """A stdlib formatter rendering records exactly like structlog's own lines."""
    if fmt == "json":
        tail: list[Processor] = [_exceptions(), structlog.processors.JSONRenderer(serializer=_dumps_str)]
    else:
        tail = [_console()]
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_shared(), structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
    )


def configure_logging(level: str = "INFO", *, fmt: str = "json", cache: bool = True) -> None:
    global _configured
    if fmt == "json":
        tail: list[Processor] = [_exceptions(), structlog.processors.JSONRenderer(serializer=_dumps)]
        factory: Any = structlog.BytesLoggerFactory(sys.stdout.buffer)
    else:
        tail = [_console()]
        factory = structlog.PrintLoggerFactory(sys.stdout)
    structlog.configure(
        processors=_shared() + tail,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level]),
        logger_factory=factory,
        cache_logger_on_first_use=cache,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(stdlib_formatter(fmt))
    handler._rerank_gateway = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in list(root.handlers):
        # Ours from an earlier call and plain console handlers (basicConfig's) would print every
        # line twice; others (files, pytest's capture) stay.
        if getattr(old, "_rerank_gateway", False) or type(old) is logging.StreamHandler:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn(...) -> the "py.warnings" logger -> one line
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.ERROR)
    # Progress bars are not log lines; a server has no terminal to draw them on.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    _vllm_logging_file(level, fmt)
    _configured = True
    adopt_library_loggers()


def adopt_library_loggers() -> None:
    """Make libraries that installed their own handlers log through the root handler instead."""
    if not _configured:
        return
    for name in _LIBRARY_LOGGERS:
        lib = logging.getLogger(name)
        for old in list(lib.handlers):
            lib.removeHandler(old)
        lib.propagate = True
    if "transformers" in sys.modules:
        try:
            sys.modules["transformers"].utils.logging.disable_progress_bar()
        except AttributeError:  # an old or partial transformers: its bars stay
            pass


def _vllm_logging_file(level: str, fmt: str) -> None:
    # vLLM (re)configures its loggers at import in every process it starts, from this file when
    # set: our formatter there too, so engine-core lines are JSON as well.
    ours = os.environ.get("RERANK_VLLM_LOGGING_FILE")
    if "VLLM_LOGGING_CONFIG_PATH" in os.environ and os.environ["VLLM_LOGGING_CONFIG_PATH"] != ours:
        return  # the operator's own vLLM logging config wins
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"gateway": {"()": "gateway.observability.logging.stdlib_formatter", "fmt": fmt}},
        "handlers": {
            "gateway": {"class": "logging.StreamHandler", "formatter": "gateway", "stream": "ext://sys.stdout"}
        },
        "loggers": {"vllm": {"handlers": ["gateway"], "level": level, "propagate": False}},
    }
    if ours:
        path = ours
    else:
        fd, path = tempfile.mkstemp(prefix="rerank-gateway-vllm-logging-", suffix=".json")
        os.close(fd)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path
    os.environ["RERANK_VLLM_LOGGING_FILE"] = path
