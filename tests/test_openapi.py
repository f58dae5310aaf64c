"""The OpenAPI document describes the wire (issue #12, item 4); fuzzed in test_reliability.py."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.errors import ERROR_TABLE
from gateway.http.openapi import ERROR_RESPONSES, RERANK_ERRORS
from gateway.security.auth import hash_key
from schemas.config import ApiKeyConfig, AuthConfig, LimitsConfig, Settings, StaticEngineConfig

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/v1/rerank", "/v2/rerank", "/v1/v2/rerank")
MODELS = (StaticEngineConfig(name="static", aliases=("rerank-v3.5",)),)


def _document(**kw):
    app = create_app(Settings(models=MODELS, **kw), configure_logs=False)
    with TestClient(app) as client:
        return client.get("/schema/openapi.json").json()


@pytest.fixture(scope="module")
def doc():
    return _document(limits=LimitsConfig(max_documents=123))


def _resolve(doc, node):
    ref = node.get("$ref")
    return doc["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else node


def test_every_error_status_is_documented_with_our_body(doc):
    table = {status for status in ERROR_TABLE.values() if status != 499} | {400, 404, 408, 413, 500}
    assert table <= set(ERROR_RESPONSES)
    error_body = doc["components"]["schemas"]["ErrorBody"]
    assert set(error_body["required"]) == {"message", "id", "detail"}
    for path in RERANK_PATHS:
        responses = doc["paths"][path]["post"]["responses"]
        for status in RERANK_ERRORS:
            content = responses[str(status)]["content"]["application/json"]["schema"]
            if path in ("/v1/rerank", "/rerank", "/v1/v1/rerank"):  # also TEI's routes (gateway.http.dialects)
                content = content["oneOf"][0]
            assert content == {"$ref": "#/components/schemas/ErrorBody"}, (path, status)
            assert "x-request-id" in responses[str(status)]["headers"]
        assert "Retry-After" in responses["503"]["headers"] and "Retry-After" in responses["429"]["headers"]


def test_integer_bounds_and_non_empty_constraints(doc):
    request = doc["components"]["schemas"]["RerankRequest"]["properties"]
    for field in ("top_n", "max_tokens_per_doc", "max_chunks_per_doc"):
        integer = request[field]["anyOf"][0]
        assert integer["type"] == "integer" and integer["minimum"] == 1 and integer["maximum"] == 2**31 - 1
    priority = request["priority"]["anyOf"][0]
    assert (priority["minimum"], priority["maximum"]) == (0, 999)
    assert request["documents"]["minItems"] == 1 and request["documents"]["maxItems"] == 123
    assert request["query"]["anyOf"][0]["pattern"] == r"\S"
    assert doc["components"]["schemas"]["TextObject"]["properties"]["text"]["pattern"] == r"\S"
    assert request["rank_fields"]["anyOf"][0]["minItems"] == 1
    assert request["model"]["anyOf"][0]["enum"] == ["static", "rerank-v3.5"]


def test_v2_requires_model(doc):
    for path in ("/v2/rerank", "/v1/v2/rerank"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        schema = _resolve(doc, body)
        assert "model" in schema["required"] and schema["properties"]["model"]["enum"] == ["static", "rerank-v3.5"]
    v1_body = doc["paths"]["/v1/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    v1 = _resolve(doc, v1_body["anyOf"][0])  # anyOf Cohere's and TEI's request (gateway.http.dialects)
    assert "model" not in v1["required"]


def test_ready_documents_its_503(doc):
    assert "503" in doc["paths"]["/ready"]["get"]["responses"]


def test_security_declared_only_with_keys(doc):
    assert all("security" not in doc["paths"][p]["post"] for p in RERANK_PATHS)
    keyed = _document(auth=AuthConfig(keys=(ApiKeyConfig(id="k", hash=hash_key("rk-x" * 10), models=("*",)),)))
    assert all(keyed["paths"][p]["post"]["security"] == [{"bearer": []}] for p in RERANK_PATHS)


def test_rank_fields_matching_nothing_fall_back_to_text():
    # Schema-valid (object documents carry `text`), so it must not be a 422.
    app = create_app(Settings(models=MODELS), configure_logs=False)
    with TestClient(app) as client:
        body = {"model": "static", "query": "q", "documents": [{"text": "a"}, {"title": "t"}], "rank_fields": ["title"]}
        assert client.post("/v2/rerank", json=body).status_code == 200
        body["documents"] = [{"other": "a"}]
        resp = client.post("/v2/rerank", json=body)
        assert resp.status_code == 422 and "none of the rank_fields" in resp.json()["message"]
