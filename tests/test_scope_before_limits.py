"""A key that does not cover the model gets 403 before any check of the request's content.

The Cohere routes resolve the model (404) and check the key's scope (403) before looking at the
documents (empty: 422, too many: 413). The TEI handler checked empty and too many ``texts`` first,
and vLLM's ``/score`` the pairing and the pair count before resolving ``model``: a caller without
access to the model learned ``limits.max_documents`` and got a misleading 400/413 (and on
``/score`` an unknown model with too many pairs was 413, not 404).
"""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.security.auth import hash_key
from schemas.config import ApiKeyConfig, AuthConfig, DialectsConfig, LimitsConfig, Settings, StaticEngineConfig

KEY = "rk-fix-scope-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
TOO_MANY = ["a", "b", "c", "d"]  # limits.max_documents is 3


@pytest.fixture(scope="module")
def client():
    settings = Settings(
        limits=LimitsConfig(max_documents=3),
        dialects=DialectsConfig(tei_model="private"),  # the TEI model is outside the key's scope
        models=(StaticEngineConfig(name="open"), StaticEngineConfig(name="private")),
        auth=AuthConfig(keys=(ApiKeyConfig(id="scoped", hash=hash_key(KEY), models=("open",)),)),
    )
    with TestClient(create_app(settings, configure_logs=False)) as c:
        yield c


@pytest.mark.parametrize("texts", [TOO_MANY, []], ids=["too-many", "empty"])
@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank"])
def test_tei_out_of_scope_is_403_before_texts_checks(client, path, texts):
    resp = client.post(path, json={"query": "q", "texts": texts}, headers=AUTH)
    assert resp.status_code == 403, resp.text
    body = resp.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == "Validation", body
    assert "not allowed to use model 'private'" in body["error"]


@pytest.mark.parametrize(
    "sides",
    [
        {"text_1": "q", "text_2": TOO_MANY},
        {"text_1": ["q", "r"], "text_2": ["a", "b", "c"]},
        {"text_1": [], "text_2": ["a"]},
    ],
    ids=["too-many", "bad-pairing", "empty"],
)
def test_vllm_out_of_scope_is_403_before_pair_checks(client, sides):
    resp = client.post("/score", json={"model": "private", **sides}, headers=AUTH)
    assert resp.status_code == 403, resp.text
    error = resp.json()["error"]
    assert error["type"] == "Forbidden" and "not allowed to use model 'private'" in error["message"], error


def test_vllm_unknown_model_is_404_before_pair_count(client):
    resp = client.post("/score", json={"model": "nope", "text_1": "q", "text_2": TOO_MANY}, headers=AUTH)
    assert resp.status_code == 404, resp.text
    assert resp.json()["error"]["type"] == "NotFoundError"


def test_cohere_out_of_scope_is_403_before_documents_checks(client):
    for docs in (TOO_MANY, []):
        resp = client.post("/v1/rerank", json={"model": "private", "query": "q", "documents": docs}, headers=AUTH)
        assert resp.status_code == 403, resp.text


def test_in_scope_limits_still_apply(client):
    # The same checks still answer for a key that covers the model.
    resp = client.post("/score", json={"model": "open", "text_1": "q", "text_2": TOO_MANY}, headers=AUTH)
    assert resp.status_code == 413, resp.text
    resp = client.post("/score", json={"model": "open", "text_1": ["q", "r"], "text_2": ["a", "b", "c"]}, headers=AUTH)
    assert resp.status_code == 400 and "1:1, 1:N or N:N" in resp.text, resp.text
    ok = client.post("/score", json={"model": "open", "text_1": "q", "text_2": ["a"]}, headers=AUTH)
    assert ok.status_code == 200, ok.text
