"""A JSON number too large for a float (``1e400``) is an invalid value: 422 like any other.

msgspec reports such a number as a ``ValidationError`` ("Number out of range"), a subclass of
``DecodeError``. The typed decode turned it into the 422 every invalid value gets; the slow path
(a body with an integral float such as ``"top_n": 2.0``) decoded untyped first, and that decode's
error was caught as ``DecodeError`` and answered 400 "JSON is malformed" -- the same number on
the same route got 400 or 422 depending on an unrelated field.
"""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.errors import InvalidRequestError
from gateway.http.decoding import decode_json
from schemas.config import DialectsConfig, Settings, StaticEngineConfig
from schemas.rerank import RerankRequest

COHERE_ROUTES = ("/v1/rerank", "/rerank", "/v2/rerank")
# Each: a 1e400 alone (the fast path), and with an integral float before it (the slow path).
COHERE_BODIES = (
    b'{"model": "m", "query": "q", "documents": ["a"], "top_n": 1e400}',
    b'{"model": "m", "query": "q", "documents": ["a"], "top_n": 2.0, "max_tokens_per_doc": 1e400}',
    b'{"model": "m", "query": "q", "documents": ["a"], "top_n": 2.0, "priority": -1e400}',
    b'{"model": "m", "query": "q", "top_n": 2.0, "documents": [{"text": "a", "n": 1e400}]}',
)
TEI_BODIES = (
    b'{"query": "q", "texts": ["a"], "truncate": 1e400}',
    b'{"query": "q", "texts": ["a"], "raw_scores": 1.0, "truncate": 1e400}',
)
VLLM_BODIES = (
    b'{"model": "m", "text_1": "q", "text_2": ["a"], "max_tokens_per_doc": 1e400}',
    b'{"model": "m", "text_1": "q", "text_2": ["a"], "max_tokens_per_doc": 2.0, "instruction": 1e400}',
)


@pytest.fixture(scope="module")
def client():
    settings = Settings(models=(StaticEngineConfig(name="m"),), dialects=DialectsConfig(tei_model="m"))
    with TestClient(create_app(settings, configure_logs=False)) as c:
        yield c


def _post(client, path: str, body: bytes):
    return client.post(path, content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("body", COHERE_BODIES)
@pytest.mark.parametrize("path", COHERE_ROUTES)
def test_overflowing_number_is_422_on_cohere_routes(client, path, body):
    resp = _post(client, path, body)
    assert resp.status_code == 422, resp.text
    data = resp.json()
    assert set(data) == {"message", "id", "detail"}, data
    assert data["message"].startswith("invalid request: Number out of range"), data


@pytest.mark.parametrize("body", TEI_BODIES)
def test_overflowing_number_is_422_validation_on_tei(client, body):
    resp = _post(client, "/rerank", body)
    assert resp.status_code == 422, resp.text
    data = resp.json()
    assert set(data) == {"error", "error_type"} and data["error_type"] == "Validation", data
    assert data["error"].startswith("invalid request: Number out of range"), data


@pytest.mark.parametrize("body", VLLM_BODIES)
def test_overflowing_number_is_vllms_invalid_request_on_score(client, body):
    resp = _post(client, "/score", body)
    assert resp.status_code == 400, resp.text  # vLLM's status for every invalid request
    error = resp.json()["error"]
    assert error["type"] == "BadRequestError", error
    assert error["message"].startswith("invalid request: Number out of range"), error  # not "JSON is malformed"


def test_decode_json_raises_the_invalid_request_error():
    with pytest.raises(InvalidRequestError, match="Number out of range"):
        decode_json(b'{"query": "q", "documents": ["a"], "top_n": 2.0, "max_chunks_per_doc": 1e400}', RerankRequest)
