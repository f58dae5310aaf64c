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

from typing import Any

import pytest
import structlog
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import PoolEngineConfig, Settings
from tests.loopback import wait_loaded
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
        for p in ("vllm", "vllm-score", "infinity", "cohere", "tei")
    )
    with TestClient(create_app(Settings(models=models), configure_logs=False)) as c:
        wait_loaded(c)
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


# vLLM, TEI and Infinity all serve POST /rerank, so a pool whose `protocol` names another of them
# than its replica runs gets no 404: the replica refuses the body for a field the protocol does
# not send. The gateway always sends its protocol's required fields, so no client can cause that.
TEI_MISSING = b"Failed to deserialize the JSON body into the target type: missing field `texts` at line 1 column 52"
VLLM_MISSING = {  # vLLM's validation handler (serve/exception_handling/handlers/validation.py)
    "error": {
        "message": "1 validation error:\n  {'type': 'missing', 'loc': 'body.documents', 'msg': 'Field required', "
        "'input': '<dict of 3 items>'}",
        "type": "Bad Request",
        "param": "body.documents",
        "code": 400,
    }
}
INFINITY_MISSING = {  # FastAPI's default 422
    "detail": [{"type": "missing", "loc": ["body", "documents"], "msg": "Field required", "input": {"query": "q"}}]
}


@pytest.mark.parametrize(
    ("protocol", "status", "body"),
    [
        ("vllm", 422, TEI_MISSING),  # a TEI replica behind protocol = "vllm"
        ("infinity", 422, TEI_MISSING),
        ("tei", 400, VLLM_MISSING),  # a vLLM replica behind protocol = "tei"
        ("tei", 422, INFINITY_MISSING),  # an Infinity replica behind protocol = "tei"
    ],
)
def test_another_protocols_server_on_the_same_path_is_502_naming_protocol(client, upstream, protocol, status, body):
    upstream.status, upstream.body = status, body
    with structlog.testing.capture_logs() as logs:
        r = client.post("/v1/rerank", json={"model": protocol, "query": "q", "documents": ["a", "b"]})
    assert r.status_code == 502, r.text  # not the client's 422 "upstream rejected the request"
    message = r.json()["message"]
    assert f"model '{protocol}' is misconfigured" in message and "`protocol`" in message, message
    assert upstream.url not in message and "missing" not in message
    assert next(e for e in logs if e["event"] == "pool_upstream_misconfigured")["status"] == status


def test_an_input_error_echoing_the_documents_stays_the_clients_422(client, upstream):
    # FastAPI echoes the offending input: a document's own words must not read as a missing field.
    upstream.status = 422
    upstream.body = {"detail": [{"type": "too_long", "loc": ["body", "documents"],
                                 "msg": "List should have at most 2 items after validation, not 3",
                                 "input": ["missing field `texts`", "{'type': 'missing'", "c"]}]}  # fmt: skip
    r = client.post("/v1/rerank", json={"model": "infinity", "query": "q", "documents": ["a", "b", "c"]})
    assert r.status_code == 422, r.text
