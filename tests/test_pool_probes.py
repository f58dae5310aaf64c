"""The pool engine (fast: the engine against small loopback upstreams)."""

from __future__ import annotations

import asyncio
import time

import pytest

from adapters.base import ScoreJob
from adapters.upstreams.pool import PoolEngine
from schemas.config import PoolEngineConfig
from tests.loopback import wait_loaded
from tests.test_pool import FakeReplica


@pytest.fixture
def slow_upstream():
    up = FakeReplica("infinity")  # vLLM's /rerank body and answer are Infinity's
    up.delay_s = 1.0  # slows its POSTs; GET /health stays fast
    yield up
    up.close()


def test_busy_connection_pool_does_not_fail_health_probes(slow_upstream):
    # Every keep-alive connection is taken by a slow but healthy scoring call. The /ready probe
    # of that (healthy) replica must not queue behind them and time out: that ejects the only
    # replica, and the next requests get 503 "no healthy replica" for cooldown_s.
    config = PoolEngineConfig(
        name="p", protocol="vllm", urls=(slow_upstream.url,), max_connections=1, probe_timeout_s=0.3, cooldown_s=30
    )

    async def go():
        engine = PoolEngine(config)
        await engine.start()
        try:
            busy = asyncio.create_task(engine.score(ScoreJob(query="q", instruction="", texts=["a", "b"])))
            await asyncio.sleep(0.2)  # the scoring call holds the one connection
            await engine.check_health()  # the replica's /health answers at once
            await busy
            assert engine.replica_stats()[0]["admitted"]
        finally:
            await engine.stop()

    asyncio.run(go())


@pytest.fixture
def upstream():
    up = FakeReplica("infinity")
    yield up
    up.close()


def test_traffic_readmits_a_pool_after_a_failed_ready_poll(upstream):
    # docs/upstreams.md: an ejected replica is "probed (GET health_path) when traffic next
    # arrives"; a pool "serves once a probe passes". One /ready poll during an outage marks the
    # model UNHEALTHY, and from then on the service refuses its requests (503 "unhealthy")
    # before they reach the pool, so traffic can never probe and readmit the recovered replica:
    # the model stays down until someone polls /ready again.
    from litestar.testing import TestClient

    from gateway.app import create_app
    from schemas.config import Settings

    config = PoolEngineConfig(name="p", protocol="vllm", urls=(upstream.url,), cooldown_s=0.2)
    with TestClient(create_app(Settings(models=(config,)), configure_logs=False)) as client:
        wait_loaded(client)
        body = {"model": "p", "query": "q", "documents": ["a", "b"]}
        assert client.post("/v1/rerank", json=body).status_code == 200
        upstream.healthy = False
        assert client.get("/ready").status_code == 503  # the replica is down: not ready, fine
        upstream.healthy = True
        time.sleep(0.3)  # the replica is back and its cooldown is over
        r = client.post("/v1/rerank", json=body)
        assert r.status_code == 200, r.text
