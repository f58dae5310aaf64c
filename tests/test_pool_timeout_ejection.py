"""Which timeouts eject a pool replica, against a slow replica on loopback.

A replica that sends nothing for ``read_timeout_s`` (the upstream's own timeout) counts as
failing, and repeated failures eject it. The request's deadline (the model's ``timeout_s``) and
a client that goes away cancel the call instead: the budget may have gone elsewhere (another
replica, a wait for a connection), so they never count against a replica. Hence a pool whose
``read_timeout_s`` is not below ``timeout_s`` never ejects a hung replica: ``check-config`` and
``serve`` warn about it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from litestar.testing import TestClient

from adapters.base import ScoreJob
from adapters.upstreams.pool import PoolEngine
from gateway.app import create_app
from gateway.launch.preflight import preflight
from schemas.config import PoolEngineConfig, Settings
from tests.loopback import wait_loaded
from tests.test_pool import FakeReplica

BODY = {"model": "p", "query": "q", "documents": ["a", "b"]}


@pytest.fixture
def slow():
    up = FakeReplica("infinity")
    up.delay_s = 1.0
    yield up
    up.close()


@contextmanager
def _serve(**kw: Any) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(models=(PoolEngineConfig(name="p", **kw),)), configure_logs=False)) as client:
        wait_loaded(client)
        yield client


def test_the_requests_deadline_does_not_eject(slow):
    with _serve(protocol="infinity", urls=(slow.url,), timeout_s=0.2, eject_after_failures=2) as client:
        for _ in range(3):
            assert client.post("/v1/rerank", json=BODY).status_code == 504
        [stats] = client.app.state.registry.get("p").engine.replica_stats()
        assert stats["admitted"] and stats["consecutive_failures"] == 0
        slow.delay_s = 0.0
        assert client.post("/v1/rerank", json=BODY).status_code == 200


def test_a_cancelled_call_does_not_eject(slow):
    # The gateway cancels a request's work when its client disconnects (gateway.http.middleware).
    async def go() -> dict[str, Any]:
        engine = PoolEngine(PoolEngineConfig(name="p", protocol="infinity", urls=(slow.url,), eject_after_failures=1))
        await engine.start()
        try:
            for _ in range(2):
                task = asyncio.create_task(engine.score(ScoreJob(query="q", instruction="", texts=["a"])))
                await asyncio.sleep(0.2)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            return engine.replica_stats()[0]
        finally:
            await engine.stop()

    stats = asyncio.run(go())
    assert stats["admitted"] and stats["consecutive_failures"] == 0


def test_a_replica_silent_for_read_timeout_is_ejected(slow):
    # max_ejected_share=1: by default a pool's only replica is never ejected (test_pool_ejection_cap).
    with _serve(
        protocol="infinity", urls=(slow.url,), read_timeout_s=0.2, timeout_s=5, eject_after_failures=2,
        max_ejected_share=1.0,
    ) as client:  # fmt: skip
        assert [client.post("/v1/rerank", json=BODY).status_code for _ in range(2)] == [504, 504]
        assert not client.app.state.registry.get("p").engine.replica_stats()[0]["admitted"]
        assert client.post("/v1/rerank", json=BODY).status_code == 503


def test_read_timeout_not_below_the_deadline_is_warned_about():
    model = PoolEngineConfig(name="p", protocol="vllm", urls=("http://127.0.0.1:9",), timeout_s=10)
    [warning] = preflight(Settings(models=(model,))).warnings
    assert "models[0] (p)" in warning and "read_timeout_s (30.0)" in warning and "never ejected" in warning
    ok = PoolEngineConfig(name="p", protocol="vllm", urls=("http://127.0.0.1:9",), timeout_s=10, read_timeout_s=5)
    assert preflight(Settings(models=(ok,))).warnings == []
