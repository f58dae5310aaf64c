"""Expected operator conditions answering 5xx log one line with the cause, not a traceback.

An upstream refusing the gateway's DashScope account, or a pool whose upstream is misconfigured,
is a known condition the error table types; its traceback (the request path down to the raise)
says nothing the line does not, and repeats on every request until the operator acts. So does a
timeout (504): the line names the model, what timed out and the limit. A real bug (500) keeps
its traceback. Checked on the rendered JSON lines of real requests.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from litestar import get
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.observability.logging import configure_logging
from schemas.config import DashScopeEngineConfig, PoolEngineConfig, Settings
from tests.fake_dashscope import FakeDashScope, Fault
from tests.loopback import wait_loaded
from tests.test_pool import FakeReplica
from tests.test_pool_not_a_reranker import RefusingUpstream

KEY = "sk-test-logline-0123456789abcdef"
KEY_ENV = "RERANK_TEST_LOGLINE_DASHSCOPE_KEY"


@pytest.fixture
def json_logs(monkeypatch) -> Iterator[Any]:
    """The lines the app writes (JSON format, as `serve` configures it), parsed, since the last call."""
    out = io.BytesIO()
    with monkeypatch.context() as m:  # configure_logging binds its writers to sys.stdout of the moment
        m.setattr(sys, "stdout", io.TextIOWrapper(out, write_through=True))
        configure_logging("INFO", fmt="json", cache=False)
    read = 0

    def lines() -> list[dict[str, Any]]:
        nonlocal read
        data = out.getvalue()
        text, read = data[read:].decode(), len(data)
        return [json.loads(line) for line in text.splitlines()]

    try:
        yield lines
    finally:
        structlog.reset_defaults()
        root = logging.getLogger()
        for handler in list(root.handlers):
            if getattr(handler, "_rerank_gateway", False):
                root.removeHandler(handler)
        logging.captureWarnings(False)


@pytest.fixture
def upstreams() -> Iterator[tuple[RefusingUpstream, FakeDashScope]]:
    os.environ[KEY_ENV] = KEY
    pool = RefusingUpstream()
    try:
        with FakeDashScope(api_key=KEY) as dashscope:
            yield pool, dashscope
    finally:
        pool.close()
        os.environ.pop(KEY_ENV, None)


@get("/test-only/boom", sync_to_thread=False)
def boom() -> None:
    raise RuntimeError("a bug")


def _failed(lines: list[dict[str, Any]]) -> dict[str, Any]:
    [line] = [e for e in lines if e.get("event") == "request_failed"]
    return line


def test_expected_502s_log_one_line_and_a_bug_keeps_its_traceback(json_logs, upstreams):
    pool, dashscope = upstreams
    models = (
        PoolEngineConfig(name="pool", protocol="vllm", urls=(pool.url,), model="m"),
        DashScopeEngineConfig(name="ds", model="gte-rerank-v2", base_url=dashscope.url, api_key_env=KEY_ENV, retries=0),
    )
    app = create_app(Settings(models=models), configure_logs=False)
    app.register(boom)
    with TestClient(app) as client:
        wait_loaded(client)
        json_logs()

        pool.status = 404
        pool.body = {"error": {"message": "The model `m` does not exist.", "type": "NotFoundError", "code": 404}}
        r = client.post("/v1/rerank", json={"model": "pool", "query": "q", "documents": ["a"]})
        assert r.status_code == 502, r.text
        line = _failed(json_logs())
        assert "exception" not in line and line["error"] == "EngineMisconfiguredError" and line["status"] == 502
        assert "`model` setting" in line["reason"] and line["request_id"] == r.json()["id"]

        pool.status, pool.body = 401, {"error": {"message": "Unauthorized", "type": "Unauthorized", "code": 401}}
        r = client.post("/v1/rerank", json={"model": "pool", "query": "q", "documents": ["a"]})
        assert r.status_code == 502, r.text
        assert r.json()["message"] == "the model's engine failed to score this request"  # the gateway's key
        line = _failed(json_logs())
        assert "exception" not in line and line["error"] == "EngineAccountError" and "HTTP 401" in line["reason"]

        dashscope.fail_next(
            Fault(400, "Arrearage", "Access denied, please make sure your account is in good standing.")
        )
        r = client.post("/v1/rerank", json={"model": "ds", "query": "q", "documents": ["a"]})
        assert r.status_code == 502, r.text
        assert r.json()["message"] == "the model's engine failed to score this request"  # still generic
        line = _failed(json_logs())
        assert "exception" not in line and line["status"] == 502 and "Arrearage" in line["reason"]
        assert KEY not in json.dumps(line)

        r = client.get("/test-only/boom")
        assert r.status_code == 500
        line = _failed(json_logs())
        assert line["error"] == "RuntimeError" and line["exception"][0]["exc_value"] == "a bug"


def test_a_timeout_logs_one_line_naming_the_model_what_timed_out_and_the_limit(json_logs):
    slow = FakeReplica("infinity")
    slow.delay_s = 1.0
    models = (  # the replica's silence hits read_timeout_s; the model's timeout_s cuts the other first
        PoolEngineConfig(name="read", protocol="infinity", urls=(slow.url,), read_timeout_s=0.2),
        PoolEngineConfig(name="total", protocol="infinity", urls=(slow.url,), timeout_s=0.3),
    )
    try:
        with TestClient(create_app(Settings(models=models), configure_logs=False)) as client:
            wait_loaded(client)
            json_logs()

            r = client.post("/v1/rerank", json={"model": "read", "query": "q", "documents": ["a"]})
            assert r.status_code == 504, r.text
            line = _failed(json_logs())
            assert "exception" not in line and line["error"] == "EngineTimeoutError" and line["status"] == 504
            assert "model 'read'" in line["reason"] and slow.url in line["reason"], line
            assert "0.2s (read_timeout_s" in line["reason"] and line["request_id"] == r.json()["id"]

            r = client.post("/v1/rerank", json={"model": "total", "query": "q", "documents": ["a"]})
            assert r.status_code == 504, r.text
            assert r.json()["message"] == "the model's engine did not answer in time"  # no address, no limit
            line = _failed(json_logs())
            assert "exception" not in line and line["error"] == "EngineTimeoutError"
            assert "model 'total'" in line["reason"] and "0.3s (timeout_s)" in line["reason"], line
    finally:
        slow.close()
