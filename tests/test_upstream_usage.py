"""Token counts reported by an upstream are checked before they reach the response and metrics.

An upstream (vLLM, Infinity, a Cohere server, TEI's ``x-compute-tokens`` header, DashScope) that
reported a negative count, or a TEI header of thousands of digits, made the gateway answer 500
with an empty body: the negative count reached prometheus' counters (``Counter.inc`` refuses
negative amounts) after the response had started, and ``int()`` refused the long digit string.
A count that cannot be right now counts as none reported: the token estimate is used.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import DashScopeEngineConfig, PoolEngineConfig, Settings
from tests.fake_http import Answer, FakeUpstream


class Upstream(FakeUpstream[None]):
    """Answers every protocol's rerank call with 0.5 for each text and ``tokens`` as its count."""

    def __init__(self) -> None:
        super().__init__([])
        self.tokens: Any = 5

    def handle_get(self, path: str) -> Answer:
        return 200, {}, b'{"status":"ok"}'

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        body = json.loads(raw)
        t = self.tokens
        if "input" in body:  # DashScope native
            res = [{"index": i, "relevance_score": 0.5} for i in range(len(body["input"]["documents"]))]
            return 200, {}, json.dumps({"output": {"results": res}, "usage": {"total_tokens": t}}).encode()
        if "texts" in body:  # TEI: bare list, count in a header
            ranked = [{"index": i, "score": 0.5} for i in range(len(body["texts"]))]
            return 200, {"x-compute-tokens": str(t)}, json.dumps(ranked).encode()
        res = [{"index": i, "relevance_score": 0.5} for i in range(len(body["documents"]))]
        if path == "/v2/rerank":  # Cohere
            return 200, {}, json.dumps({"results": res, "meta": {"tokens": {"input_tokens": t}}}).encode()
        return 200, {}, json.dumps({"results": res, "usage": {"prompt_tokens": t, "total_tokens": t}}).encode()


@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    yield up
    up.close()


@pytest.fixture(scope="module")
def client(upstream):
    models = (
        PoolEngineConfig(name="vllm", protocol="vllm", urls=(upstream.url,)),
        PoolEngineConfig(name="infinity", protocol="infinity", urls=(upstream.url,)),
        PoolEngineConfig(name="cohere", protocol="cohere", urls=(upstream.url,)),
        PoolEngineConfig(name="tei", protocol="tei", urls=(upstream.url,)),
        DashScopeEngineConfig(name="dashscope", model="gte-rerank-v2", base_url=upstream.url, api_key="k", retries=0),
    )
    with TestClient(create_app(Settings(models=models), configure_logs=False), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("model", ["vllm", "infinity", "cohere", "tei", "dashscope"])
@pytest.mark.parametrize("tokens", [-7, "9" * 5000])
def test_impossible_upstream_token_counts_are_not_trusted(client, upstream, model, tokens):
    if model != "tei" and isinstance(tokens, str):
        tokens = -1  # only a header can carry thousands of digits past msgspec's int range
    upstream.tokens = tokens
    body = {"model": model, "query": "q", "documents": ["alpha", "beta"]}
    r = client.post("/v2/rerank", json=body)
    assert r.status_code == 200, r.text
    used = r.json()["meta"]["tokens"]["input_tokens"]
    assert 0 < used < 1000  # the estimate, not the upstream's number
    upstream.tokens = 5
    r = client.post("/v2/rerank", json=body)  # still serving, and a sane count is taken as is
    assert r.status_code == 200 and r.json()["meta"]["tokens"]["input_tokens"] == 5, r.text
