"""logging.format = "console" must not print frame locals in tracebacks: a 5xx's locals hold
the request scope (the Authorization header, so the API key) and the documents."""

from __future__ import annotations

import hashlib
import logging
import time

import structlog
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.observability.logging import configure_logging, stdlib_formatter
from schemas.config import Settings, StaticEngineConfig
from schemas.config.server import ApiKeyConfig, AuthConfig, LoggingConfig

KEY = "rvhttp-secret-key-0123456789"
DOC = "RVHTTP-CONFIDENTIAL-DOCUMENT"


def test_console_traceback_has_no_locals(capsys) -> None:
    digest = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()
    settings = Settings(
        logging=LoggingConfig(format="console"),
        auth=AuthConfig(keys=(ApiKeyConfig(id="k1", hash=digest, models=("*",)),)),
        models=(StaticEngineConfig(name="slow", delay_s=2.0, timeout_s=0.1),),
    )
    try:
        # As create_app(configure_logs=True) does, without caching loggers bound to capsys's stdout.
        configure_logging(settings.logging.level, fmt="console", cache=False)
        app = create_app(settings, configure_logs=False)
        with TestClient(app) as client:
            for _ in range(100):
                if client.get("/ready").status_code == 200:
                    break
                time.sleep(0.02)
            resp = client.post(
                "/v1/rerank", json={"query": "q", "documents": [DOC]}, headers={"authorization": f"Bearer {KEY}"}
            )
        assert resp.status_code == 504  # logged with its traceback
        out = capsys.readouterr()
        text = out.out + out.err
        assert "request_failed" in text
        assert KEY not in text
        assert DOC not in text
    finally:
        structlog.reset_defaults()
        root = logging.getLogger()
        for handler in list(root.handlers):  # configure_logging's, bound to capsys's stdout
            if getattr(handler, "_rerank_gateway", False):
                root.removeHandler(handler)
        logging.captureWarnings(False)


def test_console_stdlib_formatter_has_no_locals() -> None:
    def boom(secret: str) -> None:
        raise RuntimeError("boom")

    try:
        boom(KEY)
    except RuntimeError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    text = stdlib_formatter("console").format(record)
    assert "RuntimeError" in text
    assert KEY not in text
