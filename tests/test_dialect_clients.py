"""Each dialect's real clients against a real gateway process on loopback.

- TEI: Haystack's ``HuggingFaceTEIRanker`` (``huggingface-api-haystack``, the one TEI rerank
  client on PyPI that installs without torch), and the body LlamaIndex's TEI reranker sends
  (``llama-index-postprocessor-tei-rerank`` 0.6.0, ``_call_api``: ``{"query", "texts"}`` to
  ``{base_url}/rerank``), recorded: that package needs ``llama-index-core``, too heavy for CI.
- vLLM's score API has no client package; the bodies are recorded from vLLM's
  ``examples/online_serving/openai_cross_encoder_score.py`` (str x str, str x list, list x list).

Scores are compared with the Cohere route of the same process on the same inputs.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Quantum computing uses qubits.",
]
LONG = "Nevada desert sand and dry lakes. " * 30 + "Washington, D.C. is the capital of the United States."

# vLLM's examples/online_serving/openai_cross_encoder_score.py, the three prompts it posts.
VLLM_EXAMPLE_BODIES = [
    {"text_1": "What is the capital of Brazil?", "text_2": "The capital of Brazil is Brasilia."},
    {
        "text_1": "What is the capital of France?",
        "text_2": ["The capital of Brazil is Brasilia.", "The capital of France is Paris."],
    },
    {
        "text_1": ["What is the capital of Brazil?", "What is the capital of France?"],
        "text_2": ["The capital of Brazil is Brasilia.", "The capital of France is Paris."],
    },
]


@pytest.fixture(scope="module")
def haystack() -> Any:
    """Haystack's TEI ranker, imported only when these tests run (its import costs seconds)."""
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # no posthog calls from the tests
    from haystack import Document
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker, TruncationDirection

    return SimpleNamespace(Document=Document, Ranker=HuggingFaceTEIRanker, Side=TruncationDirection)


@pytest.fixture(scope="module")
def servers(tiny_qwen3_dir, tmp_path_factory):
    """One gateway whose TEI model is the tiny transformers model, one whose has no raw scores."""
    from tests.conftest import ServerProcess

    tmp = tmp_path_factory.mktemp("dialect-clients")
    tiny = ServerProcess(
        f"""
[dialects]
tei_model = "tiny"

[[models]]
name = "tiny"
engine = "transformers"
path = "{tiny_qwen3_dir}"
dtype = "float32"
max_length = 192
max_query_tokens = 32
""",
        tmp,
    )
    noraw = ServerProcess('[[models]]\nname = "noraw"\nengine = "static"\nsupports_raw_scores = false\n', tmp)
    try:
        tiny.wait_ready()
        noraw.wait_ready()
        yield tiny, noraw
    finally:
        tiny.stop()
        noraw.stop()


def _cohere_scores(url: str, query: str, docs: list[str]) -> list[float]:
    resp = httpx.post(f"{url}/v2/rerank", json={"model": "tiny", "query": query, "documents": docs}, timeout=60)
    assert resp.status_code == 200, resp.text
    by_index = {r["index"]: r["relevance_score"] for r in resp.json()["results"]}
    return [by_index[i] for i in range(len(docs))]


def test_haystack_tei_ranker_gets_the_cohere_routes_ranking(servers, haystack):
    tiny, _ = servers
    expected = _cohere_scores(tiny.url, QUERY, DOCS)
    ranker = haystack.Ranker(url=tiny.url, top_k=3, token=None)
    ranked = ranker.run(query=QUERY, documents=[haystack.Document(content=d) for d in DOCS])["documents"]
    best = sorted(range(len(DOCS)), key=lambda i: -expected[i])[:3]
    assert [d.content for d in ranked] == [DOCS[i] for i in best]
    assert [d.score for d in ranked] == pytest.approx([expected[i] for i in best], abs=1e-6)


def test_haystack_truncation_direction_reaches_the_gateway(servers, haystack):
    tiny, _ = servers
    docs = [haystack.Document(content=LONG), haystack.Document(content=DOCS[1])]
    ranker = haystack.Ranker(url=tiny.url, top_k=2, token=None)
    scores = {}
    left, right = haystack.Side.LEFT, haystack.Side.RIGHT
    for side in (left, right):
        ranked = ranker.run(query=QUERY, documents=docs, truncation_direction=side)["documents"]
        scores[side] = {d.content: d.score for d in ranked}[LONG]
        body = {"query": QUERY, "texts": [LONG], "truncate": True, "truncation_direction": side.value}
        direct = httpx.post(f"{tiny.url}/rerank", json=body, timeout=60).json()[0]["score"]
        assert scores[side] == pytest.approx(direct, abs=1e-6)
    # Left keeps the end (about Washington), Right the start (Nevada): different texts, different scores.
    assert scores[left] != pytest.approx(scores[right], abs=1e-6)


def test_haystack_sees_teis_error_shape(servers, haystack):
    _, noraw = servers
    ranker = haystack.Ranker(url=noraw.url, raw_scores=True, token=None, max_retries=1)
    with pytest.raises(RuntimeError) as info:
        ranker.run(query=QUERY, documents=[haystack.Document(content=d) for d in DOCS])
    assert "424" in str(info.value) and '"error_type":"Backend"' in str(info.value), info.value
    assert "raw scores are not available for model 'noraw'" in str(info.value)


def test_llamaindex_tei_reranker_body(servers):
    tiny, _ = servers
    expected = _cohere_scores(tiny.url, QUERY, DOCS)
    resp = httpx.post(
        f"{tiny.url}/rerank",
        json={"query": QUERY, "texts": DOCS},
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    for item in resp.json():  # what the postprocessor reads: item["index"], float(item["score"])
        assert float(item["score"]) == pytest.approx(expected[item["index"]], abs=1e-6)


@pytest.mark.parametrize("body", VLLM_EXAMPLE_BODIES, ids=["str-str", "str-list", "list-list"])
def test_vllm_example_bodies_on_score(servers, body):
    tiny, _ = servers
    resp = httpx.post(f"{tiny.url}/score", json={"model": "tiny", **body}, timeout=60)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    # vLLM's ScoreResponse fields, exactly.
    assert set(answer) == {"id", "object", "created", "model", "data", "usage"} and answer["object"] == "list"
    assert set(answer["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"}
    firsts = body["text_1"] if isinstance(body["text_1"], list) else [body["text_1"]]
    seconds = body["text_2"] if isinstance(body["text_2"], list) else [body["text_2"]]
    pairs = list(zip(firsts * len(seconds) if len(firsts) == 1 else firsts, seconds, strict=True))
    assert [d["index"] for d in answer["data"]] == list(range(len(pairs)))
    for d, (query, text) in zip(answer["data"], pairs, strict=True):
        assert set(d) == {"index", "object", "score"} and d["object"] == "score"
        assert d["score"] == pytest.approx(_cohere_scores(tiny.url, query, [text])[0], abs=1e-6)


def test_vllm_error_shape_on_the_wire(servers):
    tiny, _ = servers
    resp = httpx.post(f"{tiny.url}/v1/score", json={"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, timeout=60)
    assert resp.status_code == 400
    assert resp.json() == {
        "error": {
            "message": "Input lengths must be either 1:1, 1:N or N:N",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }


def test_one_log_line_per_dialect_request_with_the_same_fields(servers):
    tiny, _ = servers

    httpx.post(
        f"{tiny.url}/rerank", json={"query": QUERY, "texts": DOCS[:2]}, headers={"x-request-id": "dia-tei"}, timeout=60
    )
    httpx.post(
        f"{tiny.url}/score",
        json={"text_1": QUERY, "text_2": DOCS[:2]},
        headers={"x-request-id": "dia-vllm"},
        timeout=60,
    )
    httpx.post(
        f"{tiny.url}/v1/rerank",
        json={"query": QUERY, "documents": DOCS[:2]},
        headers={"x-request-id": "dia-cohere"},
        timeout=60,
    )
    # The access line is written once the answer is sent: the client can read its answer before
    # the server's output holds the line (the last one was missing once under CI load). Bounded wait.
    lines: dict[str, dict] = {}
    for _ in range(200):
        for line in tiny.output().splitlines():
            if line.startswith("{") and '"request"' in line:
                record = json.loads(line)
                lines[record.get("request_id")] = record
        if {"dia-tei", "dia-vllm", "dia-cohere"} <= lines.keys():
            break
        time.sleep(0.05)
    tei, vllm, cohere = lines["dia-tei"], lines["dia-vllm"], lines["dia-cohere"]
    assert tei["dialect"] == "tei" and vllm["dialect"] == "vllm"
    for record in (tei, vllm, cohere):
        assert (
            record["model"] == "tiny" and record["documents"] == 2 and record["items"] == 2 and record["status"] == 200
        )
    assert tei["tokens"] == vllm["tokens"] == cohere["tokens"] > 0
    assert QUERY not in tiny.output() and DOCS[0] not in tiny.output()
