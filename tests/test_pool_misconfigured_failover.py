"""A misconfigured replica in a pool whose other replicas are fine does not cost the client a 502.

A half-migrated pool (one replica still serving another model) would otherwise answer 502 for its
share of the requests, with affinity the same queries every time, although a healthy replica
could answer. Its refusal is retried on another replica and counted against it, so it leaves
rotation (under ``max_ejected_share``). A pool whose every replica refuses still answers the 502
naming the setting to fix; a pool of one answers it at once (tests/test_pool_wrong_model.py).
"""

from __future__ import annotations

import pytest
import structlog
from litestar.testing import TestClient

from adapters.upstreams.pool import Replica, rendezvous_order
from gateway.app import create_app
from schemas.config import PoolEngineConfig, Settings
from tests.loopback import wait_loaded
from tests.test_pool_not_a_reranker import RefusingUpstream
from tests.test_pool_wrong_model import VLLM_404

MODEL = "Qwen/Qwen3-Reranker-0.6B"
GOOD = {"results": [{"index": 0, "relevance_score": 0.9}, {"index": 1, "relevance_score": 0.2}],
        "usage": {"prompt_tokens": 12}}  # fmt: skip


@pytest.fixture
def upstreams():
    made: list[RefusingUpstream] = []

    def make(status: int, body: object) -> RefusingUpstream:
        made.append(RefusingUpstream())
        made[-1].status, made[-1].body = status, body
        return made[-1]

    yield make
    for server in made:
        server.close()


def _client(*urls: str) -> TestClient:
    config = PoolEngineConfig(
        name="pool", protocol="vllm", urls=urls, model=MODEL, eject_after_failures=2, cooldown_s=60,
    )  # fmt: skip
    return TestClient(create_app(Settings(models=(config,)), configure_logs=False))


def test_a_replica_serving_another_model_is_failed_over_and_ejected(upstreams):
    bad, good = upstreams(404, VLLM_404), upstreams(200, GOOD)
    # A query whose affinity sends it to the bad replica first, every time.
    query = next(
        q for q in (f"q{i}" for i in range(100))
        if rendezvous_order(f"\x00{q}".encode(), [Replica(bad.url), Replica(good.url)])[0].url == bad.url
    )  # fmt: skip
    with _client(bad.url, good.url) as client:
        wait_loaded(client)
        with structlog.testing.capture_logs() as logs:
            for _ in range(5):
                r = client.post("/v1/rerank", json={"model": "pool", "query": query, "documents": ["a", "b"]})
                assert r.status_code == 200, r.text
                assert [(x["index"], x["relevance_score"]) for x in r.json()["results"]] == [(0, 0.9), (1, 0.2)]
        stats = {s["url"]: s for s in client.app.state.registry.get("pool").engine.replica_stats()}
    assert stats[bad.url]["admitted"] is False  # ejected after eject_after_failures=2 refusals
    assert stats[good.url]["admitted"] and stats[good.url]["served"] == 5
    refusals = [e for e in logs if e["event"] == "pool_upstream_misconfigured"]
    assert len(refusals) == 2 and all(e["replica"] == bad.url for e in refusals)  # then out of rotation
    assert any(e["event"] == "replica_ejected" and e["replica"] == bad.url for e in logs)


def test_a_pool_whose_every_replica_is_misconfigured_still_answers_502(upstreams):
    a, b = upstreams(404, VLLM_404), upstreams(404, VLLM_404)
    with _client(a.url, b.url) as client:
        wait_loaded(client)
        for _ in range(4):  # before and after one of them is ejected (the cap keeps the other)
            with structlog.testing.capture_logs() as logs:
                r = client.post("/v1/rerank", json={"model": "pool", "query": "q", "documents": ["a", "b"]})
            assert r.status_code == 502, r.text
            message = r.json()["message"]
            assert "model 'pool' is misconfigured" in message and "`model`" in message, message
            assert a.url not in message and b.url not in message
            assert {e["replica"] for e in logs if e["event"] == "pool_upstream_misconfigured"} <= {a.url, b.url}
