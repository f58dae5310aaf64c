"""A passing /ready probe does not wipe an admitted replica's run of failed calls.

A replica serving another model passes its ``/health`` but refuses every rerank call. If each
``/ready`` poll (every 5 s in deploy/k8s) reset its ``consecutive_failures``, a pool that gets
fewer than ``eject_after_failures`` calls between two polls would never eject it: every call
sent to it would pay a refusal and a failover, forever. Only an answered call ends the run.

The engine runs against loopback upstreams (tests/test_pool_not_a_reranker.RefusingUpstream:
GET /health is 200, POSTs get the status the test sets); ``check_health`` is what ``/ready`` runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from adapters.base import ScoreJob
from adapters.upstreams.pool import PoolEngine
from schemas.config import PoolEngineConfig
from tests.test_pool_backoff import MODEL, Clock, _query_preferring, pair  # noqa: F401  (the fixture: a bad replica and a good one)
from tests.test_pool_not_a_reranker import RefusingUpstream


def _run(pair: tuple[RefusingUpstream, RefusingUpstream], body: Callable[..., Awaitable[None]], **kw: Any) -> None:
    bad, good = pair
    urls = (bad.url, good.url)
    config = PoolEngineConfig(name="pool", protocol="vllm", urls=urls, model=MODEL, cooldown_s=10, **kw)
    query = _query_preferring(bad.url, urls)

    async def go() -> None:
        engine = PoolEngine(config, clock=Clock())
        await engine.start()
        try:

            async def ask() -> None:  # refused by the bad replica, answered by the good one
                result = await engine.score(ScoreJob(query=query, instruction="", texts=["a", "b"]))
                assert result.scores == [0.9, 0.2]

            await body(engine, ask)
        finally:
            await engine.stop()

    asyncio.run(go())


def test_a_passing_ready_probe_does_not_reset_the_failed_calls_of_an_admitted_replica(pair):
    async def body(engine: PoolEngine, ask: Any) -> None:
        for _ in range(2):
            await ask()
        assert engine.replica_stats()[0]["consecutive_failures"] == 2
        await engine.check_health()  # both /health answer 200
        assert engine.replica_stats()[0]["consecutive_failures"] == 2
        await ask()  # its third refusal in a row: out
        assert engine.replica_stats()[0]["admitted"] is False

    _run(pair, body, eject_after_failures=3)


def test_a_passing_ready_probe_does_not_end_a_capped_spell_of_failed_calls(pair):
    # max_ejected_share = 0: the cap keeps the refusing replica in rotation. Its refusals go on
    # after a passing /ready probe, so the cap still holds it back: one line, not one per poll.
    async def body(engine: PoolEngine, ask: Any) -> None:
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                await ask()
            for _ in range(3):
                await engine.check_health()
                await ask()
        capped = [e for e in logs if e["event"] == "replica_ejection_capped"]
        assert len(capped) == 1, capped
        assert engine.replica_stats()[0]["consecutive_failures"] == 6

    _run(pair, body, eject_after_failures=3, max_ejected_share=0.0)
