"""The HTTP API in-process: every request field on v1 / v2 / Jina shapes, responses, errors, ids.

Models: ``static`` (fixed scores keyed by exact rank text, so we can see what text the gateway
ranked), ``tiny`` (the real transformers engine on the tiny checkpoint, small window so long
documents are chunked), and models that fail in controlled ways.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import LimitsConfig, Settings, StaticEngineConfig, TransformersEngineConfig
from tests import reference
from tests.loopback import wait_loaded

Q = "What is the capital of the United States?"
STATIC_SCORES = {
    "alpha": 0.2,
    "beta": 0.9,
    "gamma": 0.5,
    "tie": 0.7,
    "Title: Paris\nBody: capital of France": 0.8,
    "Body: capital of France": 0.3,
    "year: 2024": 0.6,
}
TINY_WINDOW = 160
# Engine vs reference: the engine runs documents batched and left-padded, the reference one by one,
# so the same fp32 math runs through other kernels. Here they agree to ~1e-7; one CI host put one
# score 2.4e-5 away (2026-12-03). A real mistake -- a token more or less, another instruction, a
# chunk missed -- moves these tiny-model scores by 1e-2 or more, so 1e-4 still catches every one.
PARITY = 1e-4


def _settings(tiny_dir) -> Settings:
    return Settings(
        limits=LimitsConfig(max_body_bytes=200_000, max_documents=50, max_total_chunks=40),
        models=(
            StaticEngineConfig(name="static", aliases=("rerank-v3.5",), scores=STATIC_SCORES, score=0.1),
            TransformersEngineConfig(
                name="tiny", path=str(tiny_dir), dtype="float32", max_length=TINY_WINDOW, max_query_tokens=32
            ),
            TransformersEngineConfig(name="broken", path="/nonexistent/Qwen3-Reranker-0.6B"),
            StaticEngineConfig(name="slow", delay_s=2.0, timeout_s=0.2),
            StaticEngineConfig(name="busy", delay_s=0.5, max_concurrent_requests=1),
        ),
    )


@pytest.fixture(scope="module")
def client(tiny_qwen3_dir):
    app = create_app(_settings(tiny_qwen3_dir), configure_logs=False)
    with TestClient(app) as c:
        wait_loaded(c, 60)
        yield c


def rerank(client, body, path="/v1/rerank", **kw):
    return client.post(path, json=body, **kw)


def ok(resp):
    assert resp.status_code == 200, resp.text
    return resp.json()


# -- request shapes -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank", "/v1/v2/rerank", "/v1/v1/rerank"])
def test_every_route_ranks(client, path):
    body = ok(rerank(client, {"model": "static", "query": Q, "documents": ["alpha", "beta", "gamma"]}, path))
    assert [r["index"] for r in body["results"]] == [1, 2, 0]
    assert [r["relevance_score"] for r in body["results"]] == [0.9, 0.5, 0.2]
    assert body["meta"]["api_version"]["version"] == ("2" if "v2" in path else "1")


def test_response_superset_shape(client):
    resp = rerank(client, {"model": "static", "query": Q, "documents": ["alpha", "beta"]})
    body = ok(resp)
    assert set(body) == {"id", "results", "meta", "model", "usage"}
    assert body["id"] == resp.headers["x-request-id"]
    assert body["model"] == "static"
    assert isinstance(body["meta"]["billed_units"]["search_units"], int)
    assert body["meta"]["tokens"]["input_tokens"] == body["usage"]["total_tokens"] > 0
    assert all(set(r) == {"index", "relevance_score"} for r in body["results"])  # document omitted, not null
    for header in ("x-process-time-ms", "x-inference-time-ms", "x-tokenize-time-ms"):
        assert float(resp.headers[header]) >= 0


def test_null_valued_optionals_are_accepted(client):
    body = {
        "model": "static",
        "query": Q,
        "documents": ["alpha", "beta"],
        "top_n": None,
        "rank_fields": None,
        "return_documents": None,
        "max_chunks_per_doc": None,
        "max_tokens_per_doc": None,
        "priority": None,
        "instruction": None,
        "instruct": None,
    }
    for path in ("/v1/rerank", "/v2/rerank"):
        assert len(ok(rerank(client, body, path))["results"]) == 2


def test_unknown_fields_are_ignored(client):
    assert ok(rerank(client, {"model": "static", "query": Q, "documents": ["a"], "truncate": "END", "x": [1]}))


def test_v2_accepts_old_sdk_fields(client):
    """cohere 5.9-5.15 still send object documents, rank_fields, return_documents, max_chunks_per_doc."""
    body = ok(
        rerank(
            client,
            {
                "model": "static",
                "query": Q,
                "documents": [{"Title": "Paris", "Body": "capital of France"}, "beta"],
                "rank_fields": ["Title", "Body"],
                "return_documents": True,
                "max_chunks_per_doc": 3,
                "max_tokens_per_doc": 100,
                "priority": 5,
            },
            "/v2/rerank",
        )
    )
    assert body["results"][0] == {"index": 1, "relevance_score": 0.9, "document": {"text": "beta"}}
    assert body["results"][1]["document"] == {"Title": "Paris", "Body": "capital of France"}


def test_v2_requires_model(client):
    resp = rerank(client, {"query": Q, "documents": ["a"]}, "/v2/rerank")
    assert resp.status_code == 422 and "model parameter is required" in resp.json()["message"]


def test_v1_without_model_uses_the_default_model(client):
    assert ok(rerank(client, {"query": Q, "documents": ["beta"]}))["model"] == "static"


def test_model_alias(client):
    body = ok(rerank(client, {"model": "rerank-v3.5", "query": Q, "documents": ["beta"]}))
    assert body["model"] == "static" and body["results"][0]["relevance_score"] == 0.9


def test_jina_shape(client):
    body = ok(
        rerank(
            client,
            {
                "model": "static",
                "query": {"text": Q},
                "documents": [{"text": "alpha"}, {"text": "beta"}],
                "top_n": 1,
                "return_documents": True,
            },
        )
    )
    assert body["results"] == [{"index": 1, "relevance_score": 0.9, "document": {"text": "beta"}}]
    assert body["model"] == "static" and body["usage"]["total_tokens"] > 0


def test_object_documents_keep_their_keys(client):
    docs = [{"text": "beta", "id": "doc-7", "meta": {"k": [1, 2]}}, {"text": "alpha", "n": 3}]
    body = ok(rerank(client, {"model": "static", "query": Q, "documents": docs, "return_documents": True}))
    assert [r["document"] for r in body["results"]] == docs


def test_rank_fields_pick_and_join_fields(client):
    docs = [
        {"Title": "Paris", "Body": "capital of France", "Other": "x"},
        {"Body": "capital of France"},
        {"year": 2024},
    ]
    body = ok(
        rerank(client, {"model": "static", "query": Q, "documents": docs, "rank_fields": ["Title", "Body", "year"]})
    )
    assert {r["index"]: r["relevance_score"] for r in body["results"]} == {0: 0.8, 1: 0.3, 2: 0.6}


def test_top_n(client):
    docs = ["alpha", "beta", "gamma"]
    assert [
        r["index"]
        for r in ok(rerank(client, {"model": "static", "query": Q, "documents": docs, "top_n": 2}))["results"]
    ] == [1, 2]
    assert len(ok(rerank(client, {"model": "static", "query": Q, "documents": docs, "top_n": 99}))["results"]) == 3


def test_return_documents_both_ways(client):
    docs = ["alpha", "beta"]
    with_docs = ok(rerank(client, {"model": "static", "query": Q, "documents": docs, "return_documents": True}))
    assert [r["document"] for r in with_docs["results"]] == [{"text": "beta"}, {"text": "alpha"}]
    without = rerank(client, {"model": "static", "query": Q, "documents": docs, "return_documents": False})
    assert '"document"' not in without.text


def test_ties_sorted_by_index(client):
    body = ok(rerank(client, {"model": "static", "query": Q, "documents": ["tie", "zzz", "tie", "beta", "tie"]}))
    assert [r["index"] for r in body["results"]] == [3, 0, 2, 4, 1]


# -- token engine: dedup, truncation, chunk-and-max, instruction ---------------------------


def test_scores_match_reference(client, tiny_qwen3_dir):
    docs = ["Carson City is the capital city of Nevada.", "Washington, D.C. is the capital.", "qubits"]
    body = ok(rerank(client, {"model": "tiny", "query": Q, "documents": docs}))
    expected = reference.score_texts(tiny_qwen3_dir, Q, docs)
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert [got[i] for i in range(3)] == pytest.approx(expected, abs=PARITY)
    assert [r["index"] for r in body["results"]] == sorted(range(3), key=lambda i: -expected[i])


def test_duplicates_scored_once_and_copied(client):
    docs = ["Paris is in France.", "qubits", "Paris is in France.", "qubits", "Paris is in France."]
    body = ok(rerank(client, {"model": "tiny", "query": Q, "documents": docs}))
    single = ok(rerank(client, {"model": "tiny", "query": Q, "documents": docs[:2]}))
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert scores[0] == scores[2] == scores[4] and scores[1] == scores[3]
    # Only the two unique documents were run through the model.
    assert body["usage"]["total_tokens"] == single["usage"]["total_tokens"]


@pytest.mark.parametrize(
    "texts",
    [
        [],
        ["a"],
        ["ab", "cd", "ef"],  # equal lengths, all different: no duplicates
        ["ab", "cd", "ab", "x", "cd"],  # duplicates among equal lengths
        ["a", "bb", "ccc", "bb"],  # one duplicate, other lengths unique
        ["é", "e", "é"],  # lengths in characters, not bytes
    ],
)
def test_dedup_matches_a_plain_dict(texts):
    from gateway.serving.jobs import dedup

    index_of: dict[str, int] = {}
    positions = [index_of.setdefault(t, len(index_of)) for t in texts]
    unique, got = dedup(texts)
    assert (unique, list(got)) == (list(index_of), positions)


def test_instruction_per_request(client, tiny_qwen3_dir):
    docs = ["Paris is in France.", "qubits"]
    for field in ("instruction", "instruct"):
        body = ok(rerank(client, {"model": "tiny", "query": Q, "documents": docs, field: "Find similar text."}))
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        expected = reference.score_texts(tiny_qwen3_dir, Q, docs, "Find similar text.")
        assert [got[0], got[1]] == pytest.approx(expected, abs=PARITY)


LONG_DOC = "Washington, D.C. is the capital of the United States. It is a federal district. " * 8


def test_long_document_is_chunked_and_max_scored(client, tiny_qwen3_dir):
    body = ok(rerank(client, {"model": "tiny", "query": Q, "documents": [LONG_DOC, "qubits"]}))
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    expected = reference.chunked_max(tiny_qwen3_dir, Q, LONG_DOC, max_length=TINY_WINDOW)
    one_chunk = reference.chunked_max(tiny_qwen3_dir, Q, LONG_DOC, max_length=TINY_WINDOW, max_chunks=1)
    assert got[0] == pytest.approx(expected, abs=PARITY)
    assert expected != pytest.approx(one_chunk, abs=1e-6)  # chunking changed the answer
    capped = ok(rerank(client, {"model": "tiny", "query": Q, "documents": [LONG_DOC], "max_chunks_per_doc": 1}))
    assert capped["results"][0]["relevance_score"] == pytest.approx(one_chunk, abs=PARITY)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_max_tokens_per_doc_truncates_before_templating(client, tiny_qwen3_dir, path):
    body = ok(rerank(client, {"model": "tiny", "query": Q, "documents": [LONG_DOC], "max_tokens_per_doc": 20}, path))
    expected = reference.chunked_max(tiny_qwen3_dir, Q, LONG_DOC, max_length=TINY_WINDOW, max_tokens=20)
    assert body["results"][0]["relevance_score"] == pytest.approx(expected, abs=PARITY)


# -- errors ---------------------------------------------------------------------------------


def _error(resp, status, *needles):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"message", "id", "detail"}
    assert body["message"] == body["detail"] and body["id"] == resp.headers["x-request-id"]
    for needle in needles:
        assert needle in body["message"]
    assert "Traceback" not in resp.text
    return body


def test_400_malformed_json(client):
    _error(
        client.post(
            "/v1/rerank", content=b'{"query": "x", "documents": [', headers={"content-type": "application/json"}
        ),
        400,
        "malformed",
    )
    _error(client.post("/v1/rerank", content=b"", headers={"content-type": "application/json"}), 400, "empty")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"query": "", "documents": ["a"]}, "query must not be empty"),
        ({"query": "   \n", "documents": ["a"]}, "query must not be empty"),
        ({"query": Q, "documents": []}, "documents must not be empty"),
        ({"query": Q, "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": 5, "documents": ["a"]}, "$.query"),
        ({"query": Q, "documents": "a"}, "$.documents"),
        ({"query": Q, "documents": [1, 2]}, "$.documents"),
        ({"query": Q, "documents": ["a"], "return_documents": "yes"}, "$.return_documents"),
        ({"query": Q, "documents": [{"title": "no text"}]}, "'text'"),
        ({"query": Q, "documents": [{"image": "http://x/y.png"}]}, "image"),
        ({"query": Q, "documents": [{"a": "b"}], "rank_fields": []}, "rank_fields cannot be empty"),
        ({"query": Q, "documents": [{"a": "b"}], "rank_fields": ["c"]}, "none of the rank_fields"),
        ({"documents": ["a"]}, "query"),
        ({"query": Q, "documents": ["a"], "priority": 1000}, "$.priority"),
    ],
)
def test_422_semantic_validation(client, body, needle):
    _error(rerank(client, {"model": "static", **body}), 422, needle)


def test_404_unknown_model_and_route(client):
    _error(rerank(client, {"model": "nope", "query": Q, "documents": ["a"]}), 404, "model 'nope' not found")
    _error(rerank(client, {"model": "nope", "query": Q, "documents": ["a"]}, "/v2/rerank"), 404)
    _error(rerank(client, {"model": "static\n", "query": Q, "documents": ["a"]}), 404, "'static\n' not found")
    _error(client.get("/v3/rerank"), 404)
    _error(client.get("/v1/rerank"), 405)


def test_413_limits(client):
    _error(rerank(client, {"model": "static", "query": Q, "documents": ["a"] * 51}), 413, "max_documents")
    _error(
        rerank(client, {"model": "static", "query": Q, "documents": ["x" * 100_000, "y" * 100_000]}),
        413,
        "limits.max_body_bytes",
        "200000 bytes",
    )
    # 5 long documents x up to 10 chunks each > 40 chunks allowed
    _error(
        rerank(client, {"model": "tiny", "query": Q, "documents": [LONG_DOC * 3 + str(i) for i in range(5)]}),
        413,
        "chunks",
    )


def test_503_model_that_cannot_load(client):
    resp = rerank(client, {"model": "broken", "query": Q, "documents": ["a"]})
    body = _error(resp, 503, "local directory", "RERANK_MODELS__2__PATH")
    assert "Traceback" not in body["message"]
    assert int(resp.headers["retry-after"]) > 0
    ready = client.get("/ready")
    assert ready.status_code == 503
    states = {m["name"]: m for m in ready.json()["models"]}
    assert states["broken"]["state"] == "failed" and "local directory" in states["broken"]["fix"]
    assert "FileNotFoundError" in states["broken"]["error"]  # the cause stays in /ready ...
    assert "FileNotFoundError" not in body["message"]  # ... never in the 503 body
    assert states["static"]["state"] == states["tiny"]["state"] == "ready"
    # The gateway keeps serving the other models.
    assert ok(rerank(client, {"model": "static", "query": Q, "documents": ["beta"]}))


def test_504_engine_timeout(client):
    _error(rerank(client, {"model": "slow", "query": Q, "documents": ["a"]}), 504, "did not answer in time")


def test_503_overloaded_with_retry_after(client):
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(rerank, client, {"model": "busy", "query": Q, "documents": ["a"]}) for _ in range(3)]
        statuses = sorted(f.result().status_code for f in futures)
        rejected = [f.result() for f in futures if f.result().status_code == 503]
    assert statuses[0] == 200 and 503 in statuses
    assert all(r.headers["retry-after"] for r in rejected)


def test_500_never_leaks_internals(client, monkeypatch):
    from adapters.runtimes.static import StaticEngine

    async def boom(self, job):
        raise RuntimeError("secret internal detail /etc/passwd")

    monkeypatch.setattr(StaticEngine, "score", boom)
    body = _error(rerank(client, {"model": "static", "query": Q, "documents": ["a"]}), 500)
    assert "secret" not in body["message"] and body["message"] == "internal server error"
    monkeypatch.undo()
    assert ok(rerank(client, {"model": "static", "query": Q, "documents": ["beta"]}))


def test_engine_returning_nan_is_502(client, monkeypatch):
    from adapters.base import ScoreResult
    from adapters.runtimes.static import StaticEngine

    async def nan(self, job):
        return ScoreResult(scores=[float("nan")] * job.size, input_tokens=1)

    monkeypatch.setattr(StaticEngine, "score", nan)
    _error(rerank(client, {"model": "static", "query": Q, "documents": ["a"]}), 502)


# -- ids, models, health, schema ------------------------------------------------------------


def test_request_id_taken_from_client_or_generated(client):
    resp = rerank(client, {"model": "static", "query": Q, "documents": ["a"]}, headers={"x-request-id": "abc-123"})
    assert resp.headers["x-request-id"] == "abc-123" and resp.json()["id"] == "abc-123"
    bad = rerank(
        client, {"model": "static", "query": Q, "documents": ["a"]}, headers={"x-request-id": "bad id<script>" * 20}
    )
    assert "<" not in bad.headers["x-request-id"] and len(bad.headers["x-request-id"]) == 32
    err = rerank(client, {"model": "nope", "query": Q, "documents": ["a"]}, headers={"x-request-id": "err-1"})
    assert err.headers["x-request-id"] == "err-1" and err.json()["id"] == "err-1"
    assert client.get("/health").headers["x-request-id"]


def test_models_health_schema(client):
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert ids == ["static", "rerank-v3.5", "tiny", "broken", "slow", "busy"]
    assert client.get("/health").json() == {"status": "ok"}
    schema = client.get("/schema/openapi.json").json()
    assert {"/v1/rerank", "/v2/rerank", "/rerank", "/v1/models", "/health", "/ready"} <= set(schema["paths"])
    assert "RerankRequest" in schema["components"]["schemas"]
