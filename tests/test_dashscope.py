"""DashScope models through the whole gateway, against a DashScope-protocol server on loopback.

The fake (tests/fake_dashscope.py) speaks both documented endpoints, enforces DashScope's
limits and key, and is told to fail in the ways the real service does.
"""

from __future__ import annotations

import itertools
import os
import time

import pytest
import structlog
from litestar.testing import TestClient

from adapters.upstreams.dashscope import estimate_tokens, plan_calls
from gateway.app import create_app
from schemas.config import DashScopeEngineConfig, Settings
from tests.conftest import free_port
from tests.fake_dashscope import COMPATIBLE_PATH, NATIVE_PATH, FakeDashScope, Fault, fake_score, fake_tokens
from tests.hosted_gateway import DOCS, Q, rerank
from tests.loopback import wait_loaded

KEY = "sk-test-0123456789abcdef"
KEY_ENV = "RERANK_TEST_DASHSCOPE_KEY"


def _model(name: str, url: str, **kw) -> DashScopeEngineConfig:
    # Short backoff keeps retry tests fast; the policy is the same as with the defaults.
    base = {
        "model": "gte-rerank-v2",
        "base_url": url,
        "api_key_env": KEY_ENV,
        "retries": 2,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
    }
    return DashScopeEngineConfig(name=name, **{**base, **kw})


@pytest.fixture(scope="module")
def fake():
    with FakeDashScope(api_key=KEY) as server:
        yield server


@pytest.fixture(scope="module")
def client(fake):
    os.environ[KEY_ENV] = KEY
    url = fake.url
    settings = Settings(
        models=(
            _model("ds", url),
            _model(
                "ds-compat",
                url,
                endpoint="compatible",
                model="qwen3-rerank",
                instruction="Retrieve semantically similar text.",
            ),
            _model("ds-slow", url, read_timeout_s=0.3),
            _model("ds-badkey", url, api_key="sk-wrong-secret-key", api_key_env=None),
            _model("ds-nokey", url, api_key_env="RERANK_TEST_UNSET_VARIABLE"),
            _model("ds-down", f"http://127.0.0.1:{free_port()}", connect_timeout_s=0.5),
        )
    )
    app = create_app(settings, configure_logs=False)
    with TestClient(app) as c:
        wait_loaded(c)
        yield c
    os.environ.pop(KEY_ENV, None)


@pytest.fixture(autouse=True)
def _fresh(fake):
    fake.requests.clear()
    yield
    fake.fail_next()  # nothing left queued: every scripted fault was consumed
    assert fake.pending() == 0, "a scripted fault was not consumed"


def test_native_endpoint_scores_orders_and_maps_fields(client, fake):
    r = rerank(client, "ds", instruction="Find the capital", top_n=3, return_documents=True)
    assert r.status_code == 200, r.text
    body = r.json()
    expected = sorted(range(len(DOCS)), key=lambda i: -fake_score(Q, DOCS[i], "Find the capital"))[:3]
    assert [x["index"] for x in body["results"]] == expected
    for x in body["results"]:
        assert x["relevance_score"] == pytest.approx(fake_score(Q, DOCS[x["index"]], "Find the capital"), abs=1e-12)
        assert x["document"] == {"text": DOCS[x["index"]]}  # echoed by the gateway
    (call,) = fake.requests
    assert call.path == NATIVE_PATH
    assert call.headers["authorization"] == f"Bearer {KEY}"
    # All scores, no documents, instruction -> instruct: the gateway orders and echoes itself.
    assert call.body == {
        "model": "gte-rerank-v2",
        "input": {"query": Q, "documents": DOCS},
        "parameters": {"top_n": 5, "return_documents": False, "instruct": "Find the capital"},
    }
    tokens = fake_tokens(Q) * 5 + sum(map(fake_tokens, DOCS))
    assert body["usage"]["total_tokens"] == tokens


def test_compatible_endpoint_uses_config_instruction(client, fake):
    r = rerank(client, "ds-compat")
    assert r.status_code == 200, r.text
    instruct = "Retrieve semantically similar text."
    scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert scores == {i: pytest.approx(fake_score(Q, d, instruct), abs=1e-12) for i, d in enumerate(DOCS)}
    (call,) = fake.requests
    assert call.path == COMPATIBLE_PATH
    assert call.body == {"model": "qwen3-rerank", "query": Q, "documents": DOCS, "top_n": 5, "instruct": instruct}


def test_1200_documents_split_into_calls_and_merged_in_global_order(client, fake):
    docs = [f"document number {i} about topic {i % 37}" for i in range(1200)]
    r = rerank(client, "ds", documents=docs)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 1200
    expected = sorted(range(1200), key=lambda i: (-fake_score(Q, docs[i]), i))
    assert [x["index"] for x in results] == expected
    for x in results[:50] + results[-50:]:
        assert x["relevance_score"] == pytest.approx(fake_score(Q, docs[x["index"]]), abs=1e-12)
    sizes = [len(c.body["input"]["documents"]) for c in fake.requests]
    assert sorted(sizes) == [200, 500, 500]
    sent = [
        d
        for c in sorted(fake.requests, key=lambda c: docs.index(c.body["input"]["documents"][0]))
        for d in c.body["input"]["documents"]
    ]
    assert sent == docs  # every document sent exactly once, in consecutive slices


def test_token_limit_splits_long_documents_within_the_upstream_limit(client, fake):
    # 90 documents of ~2,000 bytes: ~46k tokens by DashScope's count, over its 30k per request.
    docs = [f"{i} " + "lorem ipsum dolor sit amet " * 74 for i in range(90)]
    r = rerank(client, "ds", documents=docs)
    assert r.status_code == 200, r.text  # an over-limit call would have been a 400 -> 422
    assert len(r.json()["results"]) == 90
    assert len(fake.requests) >= 2
    for call in fake.requests:
        part = call.body["input"]["documents"]
        assert estimate_tokens(Q) * len(part) + sum(map(estimate_tokens, part)) <= 30_000


def test_429_is_retried_after_retry_after(client, fake):
    fake.fail_next(Fault(429, "Throttling.RateQuota", "Requests rate limit exceeded", headers={"Retry-After": "1"}))
    start = time.monotonic()
    r = rerank(client, "ds")
    assert r.status_code == 200, r.text
    assert time.monotonic() - start >= 0.95  # waited at least Retry-After
    assert len(fake.requests) == 2


def test_5xx_is_retried(client, fake):
    fake.fail_next(Fault(500), Fault(503, "ServiceUnavailable", "busy"))
    r = rerank(client, "ds")
    assert r.status_code == 200, r.text
    assert len(fake.requests) == 3


def test_persistent_throttling_becomes_503_with_retry_after(client, fake):
    fake.fail_next(*[Fault(429, "Throttling", "slow down", headers={"Retry-After": "0"})] * 3)
    r = rerank(client, "ds")
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert "rate limited" in r.json()["message"]
    assert len(fake.requests) == 3  # the first try and `retries` = 2 more


def test_retry_after_past_the_time_budget_is_not_waited_for(client, fake):
    fake.fail_next(Fault(429, "Throttling", "slow down", headers={"Retry-After": "120"}))
    start = time.monotonic()
    r = rerank(client, "ds")
    assert r.status_code == 503
    assert time.monotonic() - start < 30  # far less than the 120 s it was asked to wait
    assert r.headers["retry-after"] == "120"
    assert len(fake.requests) == 1


def test_their_400_is_our_422_with_their_message(client, fake):
    fake.fail_next(Fault(400, "InvalidParameter", "Range of top_n should be [1, 500]"))
    r = rerank(client, "ds")
    assert r.status_code == 422
    assert "Range of top_n should be [1, 500]" in r.json()["message"]
    assert len(fake.requests) == 1  # not retried


@pytest.mark.parametrize("raw", [b'{"output": {"results": [', b'{"output": {}}', b"<html>oops</html>"])
def test_malformed_response_is_502(client, fake, raw):
    fake.fail_next(Fault(raw=raw))
    r = rerank(client, "ds")
    assert r.status_code == 502
    assert r.json()["message"] == "the model's engine failed to score this request"


def test_slow_upstream_is_504(client, fake):
    # Had the gateway waited the 1.5 s, the body "{}" would have been a 502 (malformed).
    fake.fail_next(Fault(raw=b"{}", delay_s=1.5))
    r = rerank(client, "ds-slow")
    assert r.status_code == 504
    assert r.json()["message"] == "the model's engine did not answer in time"


def test_auth_failure_is_502_and_the_key_is_never_shown(client, fake):
    with structlog.testing.capture_logs() as logs:
        r = rerank(client, "ds-badkey")
    assert r.status_code == 502
    assert "sk-wrong" not in r.text
    assert any(e["event"] == "dashscope_auth_failed" and e["code"] == "InvalidApiKey" for e in logs)
    assert not any("sk-wrong" in repr(e) for e in logs)
    ready = client.get("/ready").text
    assert "sk-wrong" not in ready and KEY not in ready


def test_missing_key_fails_the_model_with_a_hint(client):
    r = rerank(client, "ds-nokey")
    assert r.status_code == 503
    assert "RERANK_TEST_UNSET_VARIABLE" in r.json()["message"]


def test_unreachable_upstream_is_503_after_retries(client):
    r = rerank(client, "ds-down")
    assert r.status_code == 503
    assert "unreachable" in r.json()["message"]


def test_plan_calls_respects_both_limits():
    tokens = [10, 200, 5, 5, 400, 1, 1, 1]
    calls = plan_calls(20, tokens, max_items=3, max_request_tokens=300)
    assert calls[0][0] == 0 and calls[-1][1] == len(tokens)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(calls))  # consecutive, no gaps
    for start, end in calls:
        assert end - start <= 3
        # An item over the limit on its own is sent alone (DashScope truncates it).
        assert end - start == 1 or sum(20 + t for t in tokens[start:end]) <= 300
    assert estimate_tokens("abc") >= fake_tokens("abc") and estimate_tokens("12345678") >= 8
