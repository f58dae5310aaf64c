"""A replica ejected again and again stays out longer each time (Envoy's outlier detection).

A replica that refuses as misconfigured (it serves another model) passes its ``/health``, so
each cooldown ends in its readmission, and it then takes ``eject_after_failures`` more refusals
(each sent on to another replica) before it leaves again: a trickle of wasted calls and error
lines for as long as nobody fixes it. Its ejections therefore grow (``cooldown_s`` doubled per
ejection since its last success, up to ``max_cooldown_s``), and a success starts it over.

The engine runs against loopback upstreams (tests/test_pool_not_a_reranker.RefusingUpstream),
with a clock the test steps instead of sleeping through cooldowns; ``check_health`` is what
``/ready`` runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from adapters.base import ScoreJob
from adapters.upstreams.pool import PoolEngine, Replica, rendezvous_order
from schemas.config import PoolEngineConfig
from tests.test_pool_misconfigured_failover import GOOD
from tests.test_pool_not_a_reranker import RefusingUpstream
from tests.test_pool_wrong_model import VLLM_404

MODEL = "Qwen/Qwen3-Reranker-0.6B"


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pair():
    """A replica serving another model (404) and a good one, as (bad, good)."""
    bad, good = RefusingUpstream(), RefusingUpstream()
    bad.status, bad.body = 404, VLLM_404
    good.status, good.body = 200, GOOD
    yield bad, good
    bad.close()
    good.close()


def _query_preferring(url: str, urls: tuple[str, ...]) -> str:
    """A query whose affinity sends it to ``url`` first, every time it is admitted."""
    replicas = [Replica(u) for u in urls]
    queries = (f"q{i}" for i in range(100))
    return next(q for q in queries if rendezvous_order(f"\x00{q}".encode(), replicas)[0].url == url)


def _run(
    bad: RefusingUpstream, good: RefusingUpstream, body: Callable[[PoolEngine, Clock, Any], Awaitable[None]], **kw: Any
) -> None:
    urls = (bad.url, good.url)
    config = PoolEngineConfig(name="pool", protocol="vllm", urls=urls, model=MODEL, eject_after_failures=2, **kw)
    clock = Clock()
    query = _query_preferring(bad.url, urls)

    async def go() -> None:
        engine = PoolEngine(config, clock=clock)
        await engine.start()
        try:

            async def ask() -> None:  # the client always gets the good replica's answer
                result = await engine.score(ScoreJob(query=query, instruction="", texts=["a", "b"]))
                assert result.scores == [0.9, 0.2]

            await body(engine, clock, ask)
        finally:
            await engine.stop()

    asyncio.run(go())


def _bad(engine: PoolEngine) -> dict[str, Any]:
    return engine.replica_stats()[0]


def test_a_ready_poll_during_the_cooldown_does_not_readmit_a_misconfigured_replica(pair):
    # Its /health passes: readmitting it at every /ready poll (every 5 s in deploy/k8s) would
    # cut each cooldown short and bring its refusals back at once.
    async def body(engine: PoolEngine, clock: Clock, ask: Any) -> None:
        for _ in range(2):
            await ask()
        assert _bad(engine)["admitted"] is False
        clock.now += 9.9
        await engine.check_health()  # passes (both /health answer 200), and admits nobody early
        assert _bad(engine)["admitted"] is False
        clock.now += 0.1  # the cooldown is over: the passing probe readmits it
        await engine.check_health()
        assert _bad(engine)["admitted"] is True

    _run(*pair, body, cooldown_s=10)
