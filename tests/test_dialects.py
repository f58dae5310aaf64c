"""TEI's and vLLM's dialects in-process: same scores as the Cohere route, their shapes, their errors.

Scores are checked against the Cohere route (same service) and, for what only TEI can ask --
truncating a text at its end or its start in tokens -- against the independent reference
(``tests/reference.py``). Models: ``tiny`` (the transformers engine on the tiny checkpoint,
small window), ``static`` (fixed scores, raw scores as logits) and ``noraw`` (no raw output).
"""

from __future__ import annotations

import math
import re

import msgspec
import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config.settings import ConfigError, load_settings
from gateway.security.auth import hash_key
from schemas.config import (
    ApiKeyConfig,
    AuthConfig,
    CacheConfig,
    DialectsConfig,
    LimitsConfig,
    Settings,
    StaticEngineConfig,
    TransformersEngineConfig,
)
from tests import reference
from tests.loopback import wait_loaded

Q = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "The Commonwealth of the Northern Mariana Islands is a group of islands.",
    "Carson City is the capital city of Nevada.",  # a duplicate: scored once, reported twice
]
LONG = "Washington, D.C. is the capital of the United States. It is a federal district. " * 8
WINDOW = 160
STATIC = {"alpha": 0.2, "beta": 0.9, "gamma": 0.5}
KEY = "rk-dialects-test-key-0123456789"


def _settings(tiny_dir, **kw) -> Settings:
    return Settings(
        limits=LimitsConfig(max_documents=8),
        dialects=DialectsConfig(tei_model="tiny"),
        models=(
            TransformersEngineConfig(
                name="tiny", path=str(tiny_dir), dtype="float32", max_length=WINDOW, max_query_tokens=32
            ),
            StaticEngineConfig(name="static", scores=STATIC, score=0.1),
            StaticEngineConfig(name="noraw", supports_raw_scores=False),
        ),
        **kw,
    )


@pytest.fixture(scope="module")
def client(tiny_qwen3_dir):
    with TestClient(create_app(_settings(tiny_qwen3_dir), configure_logs=False)) as c:
        wait_loaded(c, 60)
        yield c


def ok(resp):
    assert resp.status_code == 200, resp.text
    return resp.json()


def cohere_scores(client, query: str, docs: list[str], model: str = "tiny", **extra) -> list[float]:
    body = ok(client.post("/v2/rerank", json={"model": model, "query": query, "documents": docs, **extra}))
    by_index = {r["index"]: r["relevance_score"] for r in body["results"]}
    return [by_index[i] for i in range(len(docs))]


def tei_error(resp, status: int, error_type: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type, body
    return body["error"]


def vllm_error(resp, status: int, kind: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == status and body["error"]["type"] == kind, body
    return body["error"]["message"]


# -- TEI ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank"])
def test_tei_body_answers_tei_array_with_the_cohere_routes_scores(client, path):
    expected = cohere_scores(client, Q, DOCS)
    ranks = ok(client.post(path, json={"query": Q, "texts": DOCS}))
    assert isinstance(ranks, list) and all(set(r) == {"index", "score"} for r in ranks)
    assert sorted(r["index"] for r in ranks) == list(range(len(DOCS)))
    assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
    for r in ranks:
        assert r["score"] == pytest.approx(expected[r["index"]], abs=1e-6)
    assert ranks[0]["index"] == max(range(len(DOCS)), key=lambda i: expected[i])


def test_tei_scores_match_the_independent_reference(client, tiny_qwen3_dir):
    ranks = ok(client.post("/rerank", json={"query": Q, "texts": DOCS[:3]}))
    expected = reference.score_texts(tiny_qwen3_dir, Q, DOCS[:3])
    for r in ranks:
        assert r["score"] == pytest.approx(expected[r["index"]], abs=1e-4)


def test_tei_return_text_echoes_each_text(client):
    ranks = ok(client.post("/rerank", json={"query": Q, "texts": DOCS, "return_text": True}))
    assert all(r["text"] == DOCS[r["index"]] for r in ranks)
    assert "text" not in ok(client.post("/rerank", json={"query": Q, "texts": DOCS, "return_text": False}))[0]


def _by_hand(tiny_dir, document: str, side: str) -> float:
    head = reference.tokenize(
        tiny_dir, f"{reference.PREFIX}<Instruct>: {reference.DEFAULT_INSTRUCTION}\n<Query>: {Q}\n<Document>:"
    )
    tail = reference.tokenize(tiny_dir, reference.SUFFIX)
    doc = reference.tokenize(tiny_dir, " " + document)
    room = WINDOW - len(head) - len(tail)
    assert len(doc) > room, "the test document must not fit the window"
    kept = doc[:room] if side == "Right" else doc[-room:]
    return reference.score_ids(tiny_dir, [head + kept + tail])[0]


@pytest.mark.parametrize("side", ["Right", "Left", "left"])
def test_tei_truncate_true_cuts_in_tokens_at_the_named_end(client, tiny_qwen3_dir, side):
    long_doc = LONG + " The end is near Nevada."
    body = {"query": Q, "texts": [long_doc], "truncate": True, "truncation_direction": side}
    score = ok(client.post("/rerank", json=body))[0]["score"]
    assert score == pytest.approx(_by_hand(tiny_qwen3_dir, long_doc, side.capitalize()), abs=1e-4)


def test_tei_truncation_sides_differ_and_default_chunks_like_cohere(client, tiny_qwen3_dir):
    long_doc = "Nevada desert sand. " * 20 + LONG
    right = ok(client.post("/rerank", json={"query": Q, "texts": [long_doc], "truncate": True}))[0]["score"]
    left = ok(
        client.post("/rerank", json={"query": Q, "texts": [long_doc], "truncate": True, "truncation_direction": "Left"})
    )
    assert right != pytest.approx(left[0]["score"], abs=1e-6)
    # No `truncate`: the gateway's chunk-and-max, exactly the Cohere route's score.
    chunked = ok(client.post("/rerank", json={"query": Q, "texts": [long_doc]}))[0]["score"]
    assert chunked == pytest.approx(cohere_scores(client, Q, [long_doc])[0], abs=1e-6)
    assert chunked == pytest.approx(reference.chunked_max(tiny_qwen3_dir, Q, long_doc, max_length=WINDOW), abs=1e-4)


def test_tei_truncate_false_refuses_a_text_longer_than_the_window(client):
    message = tei_error(
        client.post("/rerank", json={"query": Q, "texts": ["short", LONG], "truncate": False}), 413, "Validation"
    )
    assert re.search(rf"`inputs` must have less than {WINDOW} tokens\. Given: \d+", message), message
    # Texts that fit are scored as usual.
    ok(client.post("/rerank", json={"query": Q, "texts": ["short"], "truncate": False}))


def test_tei_errors_come_in_teis_shape_and_statuses(client):
    assert tei_error(client.post("/rerank", json={"query": Q, "texts": []}), 400, "Empty") == "`texts` cannot be empty"
    message = tei_error(client.post("/rerank", json={"query": Q, "texts": ["a"] * 9}), 413, "Validation")
    assert message == "batch size 9 > maximum allowed batch size 8"
    assert "$.texts[0]" in tei_error(client.post("/rerank", json={"query": Q, "texts": [1]}), 422, "Validation")
    assert "$.raw_scores" in tei_error(
        client.post("/rerank", json={"query": Q, "texts": ["a"], "raw_scores": "yes"}), 422, "Validation"
    )
    assert "truncation_direction" in tei_error(
        client.post("/rerank", json={"query": Q, "texts": ["a"], "truncation_direction": "Middle"}), 422, "Validation"
    )
    tei_error(client.post("/rerank", json={"query": " ", "texts": ["a"]}), 422, "Validation")


def test_a_body_matching_no_dialect_gets_the_cohere_422_naming_both(client):
    for body in ({"query": Q}, {"query": Q, "text_2": ["a"]}, ["a"]):
        resp = client.post("/rerank", json=body)
        assert resp.status_code == 422, resp.text
        message = resp.json()["message"]
        assert set(resp.json()) == {"message", "id", "detail"}
        assert "`documents`" in message and "`texts`" in message, message


def test_info_in_teis_shape(client):
    info = ok(client.get("/info"))
    assert info["model_id"] == "tiny" and info["max_input_length"] == WINDOW
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert info["max_client_batch_size"] == 8 and info["auto_truncate"] is True
    for field in (
        "model_sha",
        "model_dtype",
        "max_concurrent_requests",
        "max_batch_tokens",
        "max_batch_requests",
        "version",
    ):
        assert field in info


def test_openapi_documents_each_dialect(client):
    spec = ok(client.get("/schema/openapi.json"))
    rerank = spec["paths"]["/rerank"]["post"]
    refs = [s["$ref"] for s in rerank["requestBody"]["content"]["application/json"]["schema"]["anyOf"]]
    assert refs == ["#/components/schemas/RerankRequest", "#/components/schemas/TeiRerankRequest"]
    answers = rerank["responses"]["200"]["content"]["application/json"]["schema"]["oneOf"]
    assert {"$ref": "#/components/schemas/RerankResponse"} in answers
    assert {"type": "array", "items": {"$ref": "#/components/schemas/TeiRank"}} in answers
    score = spec["paths"]["/score"]["post"]
    assert score["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/VllmScoreRequest")
    assert score["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/VllmScoreResponse")
    assert score["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/VllmErrorBody")
    assert spec["paths"]["/info"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/TeiInfo"
    )
    assert set(spec["components"]["schemas"]["TeiRerankRequest"]["properties"]) == {
        "query", "texts", "truncate", "truncation_direction", "raw_scores", "return_text"
    }  # fmt: skip


# -- raw scores (both dialects) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def static_tei(tiny_qwen3_dir):
    """TEI served by the static engine (raw scores = logits) and by one without raw output."""
    apps = {}
    for name in ("static", "noraw"):
        settings = msgspec.structs.replace(_settings(tiny_qwen3_dir), dialects=DialectsConfig(tei_model=name))
        apps[name] = settings
    with (
        TestClient(create_app(apps["static"], configure_logs=False)) as raw,
        TestClient(create_app(apps["noraw"], configure_logs=False)) as noraw,
    ):
        yield raw, noraw


def test_raw_scores_reach_the_engine_or_say_clearly_they_cannot(static_tei):
    raw, noraw = static_tei
    texts = ["alpha", "beta", "gamma"]
    ranks = ok(raw.post("/rerank", json={"query": Q, "texts": texts, "raw_scores": True}))
    assert [r["index"] for r in ranks] == [1, 2, 0]
    for r in ranks:
        p = STATIC[texts[r["index"]]]
        assert r["score"] == pytest.approx(math.log(p / (1 - p)))
    assert [r["score"] for r in ok(raw.post("/rerank", json={"query": Q, "texts": texts}))] == [0.9, 0.5, 0.2]
    message = tei_error(noraw.post("/rerank", json={"query": Q, "texts": texts, "raw_scores": True}), 424, "Backend")
    assert "raw scores are not available for model 'noraw'" in message
    # vLLM's spelling of the same request: use_activation=false.
    data = ok(raw.post("/score", json={"model": "static", "text_1": Q, "text_2": texts, "use_activation": False}))[
        "data"
    ]
    assert [d["score"] for d in data] == pytest.approx([math.log(STATIC[t] / (1 - STATIC[t])) for t in texts])
    message = vllm_error(
        raw.post("/score", json={"model": "noraw", "text_1": Q, "text_2": texts, "use_activation": False}),
        400,
        "BadRequestError",
    )
    assert "raw scores are not available" in message


def test_tei_on_an_upstream_engine_cannot_cut_at_the_start_or_refuse(static_tei):
    raw, _ = static_tei
    ok(raw.post("/rerank", json={"query": Q, "texts": ["alpha"], "truncate": True}))  # the upstream cuts the end
    for extra in ({"truncate": True, "truncation_direction": "Left"}, {"truncate": False}):
        message = tei_error(raw.post("/rerank", json={"query": Q, "texts": ["alpha"], **extra}), 422, "Validation")
        assert "scored upstream" in message


# -- vLLM score API ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
@pytest.mark.parametrize(
    "sides", [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")]
)
def test_vllm_one_to_n_scores_in_input_order_equal_the_cohere_route(client, path, sides):
    expected = cohere_scores(client, Q, DOCS)
    body = ok(client.post(path, json={"model": "tiny", sides[0]: Q, sides[1]: DOCS}))
    assert body["object"] == "list" and body["model"] == "tiny" and body["id"].startswith("score-")
    assert isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == list(range(len(DOCS)))
    assert all(d["object"] == "score" for d in body["data"])
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-6)
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0 and usage["completion_tokens"] == 0


def test_vllm_n_to_n_scores_each_pair_with_its_own_query(client):
    queries = [Q, "Which city is in Nevada?", Q]
    texts = DOCS[:3]
    body = ok(client.post("/score", json={"text_1": queries, "text_2": texts}))  # no model: the default
    expected = [cohere_scores(client, q, [t])[0] for q, t in zip(queries, texts, strict=True)]
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-6)
    # One-element lists and two strings are 1:1.
    single = ok(client.post("/score", json={"text_1": [Q], "text_2": DOCS[1]}))["data"]
    assert [d["score"] for d in single] == pytest.approx(cohere_scores(client, Q, [DOCS[1]]), abs=1e-6)
    assert len(ok(client.post("/score", json={"text_1": Q, "text_2": DOCS[0]}))["data"]) == 1


def test_vllm_errors_come_in_vllms_shape(client):
    message = vllm_error(client.post("/score", json={"text_1": [Q, Q], "text_2": DOCS[:3]}), 400, "BadRequestError")
    assert message == "Input lengths must be either 1:1, 1:N or N:N"
    assert vllm_error(client.post("/score", json={"text_1": Q, "text_2": []}), 400, "BadRequestError") == (
        "At least one text_pair element must be given"
    )
    assert "one of: text_1/text_2" in vllm_error(client.post("/score", json={"text_1": Q}), 400, "BadRequestError")
    assert "$.text_2" in vllm_error(client.post("/score", json={"text_1": Q, "text_2": [1]}), 400, "BadRequestError")
    assert "not found" in vllm_error(
        client.post("/score", json={"model": "nope", "text_1": Q, "text_2": ["a"]}), 404, "NotFoundError"
    )
    assert "too many pairs" in vllm_error(
        client.post("/score", json={"text_1": Q, "text_2": ["a"] * 9}), 413, "Request Entity Too Large"
    )
    vllm_error(client.post("/score", content=b"{not json"), 400, "BadRequestError")


@pytest.mark.parametrize(
    ("stray", "value"),
    [
        ("data_1", []),  # what schemathesis sent beside queries/items (CI, 2026-12-03)
        ("text_1", "\ufeff"),  # blank as the schema's pattern reads it (ECMA white space)
        ("documents", []),
        ("data_2", []),
    ],
)
def test_a_side_sent_beside_the_pair_in_use_is_held_to_the_schema(client, stray, value):
    """The OpenAPI states every side (non-empty lists, non-blank queries), not only the pair in
    use: a stray side that breaks it is a 400, as the schema promises, not silently ignored."""
    body = {"queries": Q, "items": DOCS[:2], stray: value}
    if stray == "documents":
        body = {"text_1": Q, "text_2": DOCS[:2], stray: value}
    assert f"`{stray}` must be" in vllm_error(client.post("/score", json=body), 400, "BadRequestError")
    ok(client.post("/score", json={"queries": Q, "items": DOCS[:2], "data_1": "\x1c"}))  # \x1c is no space there


# -- one service: keys, limits, usage metrics, logs ------------------------------------------------


def test_dialects_share_keys_and_usage_metrics(tiny_qwen3_dir):
    key = ApiKeyConfig(id="dialects", hash=hash_key(KEY), models=("static",))
    settings = msgspec.structs.replace(
        _settings(tiny_qwen3_dir), auth=AuthConfig(keys=(key,)), dialects=DialectsConfig(tei_model="static")
    )
    auth = {"Authorization": f"Bearer {KEY}"}
    with TestClient(create_app(settings, configure_logs=False)) as c:
        wait_loaded(c, 60)
        # Middleware errors (before the body is read) come in the route's dialect where it is fixed.
        vllm_error(c.post("/score", json={"text_1": Q, "text_2": ["a"]}), 401, "Unauthorized")
        assert c.get("/info").status_code == 200  # as open as /v1/models
        # The key's model scope holds whatever the dialect: TEI's model and vLLM's `model`.
        vllm_error(
            c.post("/score", json={"model": "tiny", "text_1": Q, "text_2": ["a"]}, headers=auth), 403, "Forbidden"
        )
        ok(c.post("/rerank", json={"query": Q, "texts": ["alpha", "beta"]}, headers=auth))
        n_to_n = ok(
            c.post(
                "/score",
                json={"model": "static", "text_1": ["q one", "q two two"], "text_2": ["alpha", "beta"]},
                headers=auth,
            )
        )
        metrics = c.get("/metrics").text
    tokens = float(
        re.search(r'^rerank_tokens_total\{key="dialects",model="static"\} (\S+)$', metrics, re.MULTILINE).group(1)
    )
    documents = float(
        re.search(r'^rerank_documents_total\{key="dialects",model="static"\} (\S+)$', metrics, re.MULTILINE).group(1)
    )
    tei_tokens = 2 * (1 + 8)  # the static engine counts spaces + 1 per text and per pair's query (8 words)
    assert n_to_n["usage"]["total_tokens"] == (1 + 2) + (1 + 3)  # both groups' tokens, added up
    assert tokens == tei_tokens + n_to_n["usage"]["total_tokens"]
    assert documents == 4


def test_tei_model_must_be_configured(tmp_path):
    config = tmp_path / "g.toml"
    config.write_text('[dialects]\ntei_model = "nope"\n[[models]]\nname = "m"\nengine = "static"\n')
    with pytest.raises(ConfigError, match="dialects.tei_model 'nope' is not a configured model"):
        load_settings(config, environ={})


# -- Cohere v1 or Jina: the default of return_documents -----------------------------------------

JINA_NAME = "jina-reranker-v2-base-multilingual"


def _static_client(**dialects) -> TestClient:
    # The response cache is on: a body answered under one default must not be served under the other.
    settings = Settings(
        dialects=DialectsConfig(**dialects),
        cache=CacheConfig(enabled=True),
        models=(StaticEngineConfig(name="static", aliases=("rerank-v3.5", JINA_NAME)),),
    )
    return TestClient(create_app(settings, configure_logs=False))


def _echoed(c: TestClient, path: str, **fields) -> bool:
    results = ok(c.post(path, json={"query": "q", "documents": ["a", "b"], **fields}))["results"]
    echoed = {"document" in r for r in results}
    assert len(echoed) == 1, results
    if True in echoed:
        assert sorted(r["document"]["text"] for r in results) == ["a", "b"]
    return echoed.pop()


def test_return_documents_default_follows_the_model_name_sent():
    with _static_client() as c:
        for path in ("/v1/rerank", "/rerank"):
            # Same body, same model behind both names: Jina's default for the Jina name, Cohere's otherwise.
            assert _echoed(c, path, model=JINA_NAME)
            assert _echoed(c, path, model=JINA_NAME, return_documents=None)
            assert not _echoed(c, path, model="rerank-v3.5")
            assert not _echoed(c, path, model="static")
            assert not _echoed(c, path)  # no model: the first one, Cohere's default
            # What a client asks for explicitly wins.
            assert not _echoed(c, path, model=JINA_NAME, return_documents=False)
            assert _echoed(c, path, model="rerank-v3.5", return_documents=True)
        assert not _echoed(c, "/v2/rerank", model=JINA_NAME)  # Cohere v2 only


def test_return_documents_default_everywhere_or_nowhere():
    with _static_client(jina_models=("*",)) as c:
        assert _echoed(c, "/v1/rerank") and _echoed(c, "/rerank", model="rerank-v3.5")
        assert not _echoed(c, "/v2/rerank", model="rerank-v3.5")
    with _static_client(jina_models=()) as c:
        assert not _echoed(c, "/v1/rerank", model=JINA_NAME)


def test_return_documents_default_from_the_config_file(tmp_path):
    path = tmp_path / "gateway.toml"
    path.write_text('[dialects]\njina_models = ["jina-*", "my-jina"]\n[[models]]\nname = "static"\nengine = "static"\n')
    assert load_settings(path, environ={}).dialects.jina_models == ("jina-*", "my-jina")
    assert load_settings(None, environ={}).dialects.jina_models == ("jina-*",)
