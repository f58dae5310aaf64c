"""A pool whose ``model`` names a model the upstream does not serve is the operator's mistake.

vLLM answers 404 "The model `x` does not exist. Valid aliases: ..." (``serve/engine/serving.py``,
read from the installed wheel), Infinity 400 "Invalid model: Engine for model name `x` not
found. ...", a Cohere-compatible server (or another rerank-gateway) 404 "model 'x' not found".
The client can change nothing: 502 naming the `model` setting, not a generic 502 (or, for
Infinity's 400, a 422 calling the client's request invalid). The replica's address and the
upstream's list of served names go to the log only. A 404 for the route itself (wrong protocol
or a path in ``urls``) is the operator's as well.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import structlog
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import PoolEngineConfig, Settings
from tests.test_pool_not_a_reranker import RefusingUpstream


@pytest.fixture(scope="module")
def upstream():
    server = RefusingUpstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def client(upstream):
    models = tuple(
        PoolEngineConfig(name=p, protocol=p, urls=(upstream.url,), model="Qwen/Qwen3-Reranker-0.6B")
        for p in ("vllm", "vllm-score", "infinity", "cohere")
    )
    with TestClient(create_app(Settings(models=models), configure_logs=False)) as c:
        deadline = time.monotonic() + 30
        while any(m["state"] == "loading" for m in c.get("/ready").json()["models"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield c


def _openai_error(message: str, type_: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


VLLM_404 = _openai_error(
    "The model `Qwen/Qwen3-Reranker-0.6B` does not exist. Valid aliases: tiny.", "NotFoundError", 404, "model"
)
VLLM_OLD_404 = {
    "object": "error",
    "message": "The model `Qwen/Qwen3-Reranker-0.6B` does not exist.",
    "type": "NotFoundError",
    "param": None,
    "code": 404,
}
INFINITY_400 = _openai_error(
    "Invalid model: Engine for model name `Qwen/Qwen3-Reranker-0.6B` not found. Available model names are ['bge']",
    "BadRequestError",
    400,
)
COHERE_404 = {"message": "model 'Qwen/Qwen3-Reranker-0.6B' not found, make sure the correct model ID was used"}


@pytest.mark.parametrize(
    ("protocol", "status", "body"),
    [
        ("vllm", 404, VLLM_404),
        ("vllm-score", 404, VLLM_404),
        ("vllm", 404, VLLM_OLD_404),
        ("infinity", 400, INFINITY_400),
        ("cohere", 404, COHERE_404),
    ],
)
def test_a_model_the_upstream_does_not_serve_is_502_naming_the_setting(client, upstream, protocol, status, body):
    upstream.status, upstream.body = status, body
    with structlog.testing.capture_logs() as logs:
        r = client.post("/v1/rerank", json={"model": protocol, "query": "q", "documents": ["a", "b"]})
    assert r.status_code == 502, r.text
    message = r.json()["message"]
    assert f"model '{protocol}' is misconfigured" in message and "`model`" in message, message
    assert upstream.url not in message and "Valid aliases" not in message and "['bge']" not in message
    line = next(e for e in logs if e["event"] == "pool_upstream_misconfigured")
    assert line["replica"] == upstream.url and line["status"] == status
    assert line["upstream_model"] == "Qwen/Qwen3-Reranker-0.6B" and "not" in line["message"]
    stats = client.app.state.registry.get(protocol).engine.replica_stats()
    assert stats[0]["admitted"] and stats[0]["consecutive_failures"] == 0  # its /health passes: no flapping


def test_a_missing_route_is_502_naming_protocol_and_urls(client, upstream):
    upstream.status, upstream.body = 404, {"detail": "Not Found"}  # FastAPI's answer to an unknown path
    with structlog.testing.capture_logs() as logs:
        r = client.post("/v1/rerank", json={"model": "vllm", "query": "q", "documents": ["a", "b"]})
    assert r.status_code == 502, r.text
    message = r.json()["message"]
    assert "misconfigured" in message and "POST /rerank" in message and "`protocol`" in message, message
    assert upstream.url not in message
    assert next(e for e in logs if e["event"] == "pool_upstream_misconfigured")["replica"] == upstream.url
