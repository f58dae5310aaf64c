"""A pool replica serving a model that cannot rerank is the operator's problem, not the client's.

vLLM answers such a model with 400 (older) or 501 (newer) "The model does not support Rerank
(Score) API", or 400 "Unsupported task: 'score'"; Infinity with 400 "... does not support
`rerank`"; TEI with 424 "model is not a re-ranker model". The client can change nothing in its
request: 502 with a message saying so (no upstream address), not a 422 calling its request
invalid. A 400 about the input itself (too many tokens) stays the client's 422.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import structlog
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import PoolEngineConfig, Settings
from tests.loopback import LoopbackServer, wait_loaded


class RefusingUpstream(LoopbackServer):
    """Answers every POST with ``status`` and ``body`` (JSON, or bytes as text); GET /health with ``health`` (200)."""

    def __init__(self) -> None:
        self.status, self.body, self.health = 200, {}, 200
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._send(fake.health, {})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                self._send(fake.status, fake.body)

            def _send(self, status: int, payload: Any) -> None:
                raw = isinstance(payload, bytes)  # a plain-text answer (axum's rejections: TEI)
                data = payload if raw else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if raw else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)


@pytest.fixture(scope="module")
def upstream():
    server = RefusingUpstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def client(upstream):
    models = tuple(PoolEngineConfig(name=p, protocol=p, urls=(upstream.url,)) for p in ("vllm", "infinity", "tei"))
    with TestClient(create_app(Settings(models=models), configure_logs=False)) as c:
        wait_loaded(c)
        yield c


def _vllm_error(message: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": code}}


@pytest.mark.parametrize(
    ("protocol", "status", "body"),
    [
        ("vllm", 400, {"object": "error", "message": "The model does not support Rerank (Score) API",
                       "type": "BadRequestError", "param": None, "code": 400}),
        ("vllm", 501, _vllm_error("The model does not support Rerank (Score) API", 501)),
        ("vllm", 400, _vllm_error("Unsupported task: 'score' Supported tasks: ['embed']", 400)),
        ("vllm", 400, _vllm_error("This model does not support pooling", 400)),
        ("infinity", 400, _vllm_error("ModelNotDeployedError: model=`m` does not support `rerank`. Reason: "
                                      "the loaded moded cannot fullyfill `rerank`.", 400)),
        ("tei", 424, {"error": "model is not a re-ranker model", "error_type": "Backend"}),
    ],
)  # fmt: skip
def test_upstream_model_that_cannot_rerank_is_502(client, upstream, protocol, status, body):
    upstream.status, upstream.body = status, body
    with structlog.testing.capture_logs() as logs:
        r = client.post("/v1/rerank", json={"model": protocol, "query": "q", "documents": ["a", "b"]})
    assert r.status_code == 502, r.text
    message = r.json()["message"]
    assert "not a reranker" in message and "operator" in message and upstream.url not in message, message
    line = next(e for e in logs if e["event"] == "pool_upstream_misconfigured")
    assert line["replica"] == upstream.url and line["status"] == status


def test_input_too_long_stays_the_clients_422(client, upstream):
    too_long = "This model's maximum context length is 512 tokens. However, you requested 900 tokens in the input."
    upstream.status, upstream.body = 400, _vllm_error(too_long, 400)
    r = client.post("/v1/rerank", json={"model": "vllm", "query": "q", "documents": ["a", "b"]})
    assert r.status_code == 422, r.text
    assert "maximum context length is 512 tokens" in r.json()["message"]


def test_a_document_echoed_in_a_validation_error_is_not_read_as_the_upstreams_message(client, upstream):
    # Infinity refuses a text over 122,880 characters (or more than 2048 documents) with FastAPI's
    # 422, which echoes the offending input: the client's words, not the upstream's verdict.
    document = "The kiosk does not support the rerank button; " * 3000
    upstream.status = 422
    upstream.body = {"detail": [{"type": "string_too_long", "loc": ["body", "documents", 0],
                                 "msg": "String should have at most 122880 characters",
                                 "ctx": {"max_length": 122880}, "input": document}]}  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        r = client.post("/v1/rerank", json={"model": "infinity", "query": "q", "documents": [document]})
    assert r.status_code == 422, r.text  # the client's to fix, not "the operator must fix the upstream"
    assert "String should have at most 122880 characters" in r.json()["message"]
    assert not [e for e in logs if e["event"] == "pool_upstream_misconfigured"]
