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
import structlog

from adapters.base import ScoreJob
from adapters.upstreams.pool import PoolEngine, Replica, rendezvous_order
from gateway.config.settings import ConfigError, load_settings
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
        clock.now += 9.5
        await engine.check_health()  # passes (both /health answer 200), and admits nobody early
        assert _bad(engine)["admitted"] is False
        clock.now += 0.5  # the cooldown is over: the passing probe readmits it
        await engine.check_health()
        assert _bad(engine)["admitted"] is True

    _run(*pair, body, cooldown_s=10)


async def _refused_until_ejected(engine: PoolEngine, ask: Any) -> None:
    """Requests until the bad replica is ejected (eject_after_failures = 2 refusals, sent on)."""
    assert _bad(engine)["admitted"] is True
    for _ in range(2):
        await ask()
    assert _bad(engine)["admitted"] is False


async def _ejected_for(engine: PoolEngine, clock: Clock, seconds: float) -> None:
    """The bad replica, just ejected, stays out ``seconds`` (by /ready probes that pass) and no longer."""
    clock.now += seconds - 0.5  # halves add up exactly in binary floating point
    await engine.check_health()
    assert _bad(engine)["admitted"] is False, f"readmitted before {seconds} s"
    clock.now += 0.5
    await engine.check_health()
    assert _bad(engine)["admitted"] is True, f"still ejected after {seconds} s"


def test_a_replica_down_during_its_cooldown_is_readmitted_when_the_cooldown_ends(pair):
    # Down (its /health fails too) at the /ready polls inside the cooldown, up again before it
    # ends: the first poll after the end readmits it. Restarting the cooldown at each failed poll
    # kept it out until a whole cooldown after the last one.
    bad, _good = pair

    async def body(engine: PoolEngine, clock: Clock, ask: Any) -> None:
        await _refused_until_ejected(engine, ask)
        bad.health = 503
        for _ in range(3):  # polls at 3, 6 and 9 s fail
            clock.now += 3
            await engine.check_health()
            assert _bad(engine)["admitted"] is False
        bad.health = 200
        clock.now += 1  # 10 s: the cooldown is over
        await engine.check_health()
        assert _bad(engine)["admitted"] is True

    _run(*pair, body, cooldown_s=10)


def test_a_replica_still_down_when_its_cooldown_ends_stays_out_another_cooldown(pair):
    bad, _good = pair

    async def body(engine: PoolEngine, clock: Clock, ask: Any) -> None:
        await _refused_until_ejected(engine, ask)
        bad.health = 503
        clock.now += 10
        await engine.check_health()  # due, and failing: out 10 s more, counted once (no longer one)
        assert (_bad(engine)["admitted"], _bad(engine)["ejections"]) == (False, 1)
        bad.health = 200
        await _ejected_for(engine, clock, 10)

    _run(*pair, body, cooldown_s=10)


@pytest.mark.parametrize(
    ("cap", "cooldowns"),
    [
        ({}, [10, 20, 40, 80, 160, 300, 300]),  # max_cooldown_s unset: 300 s (Envoy's max_ejection_time)
        ({"max_cooldown_s": 35}, [10, 20, 35, 35]),
    ],
)
def test_a_replica_that_keeps_refusing_stays_out_twice_as_long_each_time_up_to_the_cap(pair, cap, cooldowns):
    async def body(engine: PoolEngine, clock: Clock, ask: Any) -> None:
        seen = []
        with structlog.testing.capture_logs() as logs:
            for seconds in cooldowns:
                await _refused_until_ejected(engine, ask)
                await _ejected_for(engine, clock, seconds)
                seen.append(_bad(engine))
        # Readmitted, it keeps its count (it has not answered since): the next ejection is the next step.
        wanted = [(n, later) for n, later in enumerate([*cooldowns[1:], cooldowns[-1]], 1)]
        assert [(s["ejections"], s["next_cooldown_s"]) for s in seen] == wanted
        ejected = [(e["ejections"], e["cooldown_s"]) for e in logs if e["event"] == "replica_ejected"]
        assert ejected == list(enumerate(cooldowns, 1))  # each line says how long, and the how-manieth

    _run(*pair, body, cooldown_s=10, **cap)


def test_a_replica_that_answers_again_starts_over_at_cooldown_s(pair):
    bad, _good = pair

    async def body(engine: PoolEngine, clock: Clock, ask: Any) -> None:
        for seconds in (10, 20):
            await _refused_until_ejected(engine, ask)
            await _ejected_for(engine, clock, seconds)
        bad.status, bad.body = 200, GOOD  # fixed by its operator: its first answer resets the count
        await ask()
        assert (_bad(engine)["served"], _bad(engine)["ejections"], _bad(engine)["next_cooldown_s"]) == (1, 0, 10)
        bad.status, bad.body = 404, VLLM_404  # and broken again: out for cooldown_s, not 40 s
        await _refused_until_ejected(engine, ask)
        await _ejected_for(engine, clock, 10)

    _run(*pair, body, cooldown_s=10)


@pytest.mark.parametrize(
    ("fields", "wanted"),
    [
        ("max_cooldown_s = 5", "max_cooldown_s (5.0) is below cooldown_s (10.0)"),
        ("cooldown_s = 600\nmax_cooldown_s = 300", "max_cooldown_s (300.0) is below cooldown_s (600.0)"),
        ("max_cooldown_s = 0", "models[0].max_cooldown_s: must be greater than 0"),
    ],
)
def test_a_bad_max_cooldown_is_one_config_line(tmp_path, fields, wanted):
    path = tmp_path / "c.toml"
    path.write_text(
        f'[[models]]\nname = "p"\nengine = "pool"\nprotocol = "vllm"\nurls = ["http://127.0.0.1:9"]\n{fields}\n'
    )
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    assert wanted in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_max_cooldown_s_unset_is_300_s_or_cooldown_s_when_longer():
    # A config written before max_cooldown_s existed keeps loading: cooldown_s = 600 alone is
    # not refused (its cap is 600 s: no growth, as before).
    for cooldown_s, cap in ((10.0, 300.0), (600.0, 600.0)):
        config = PoolEngineConfig(name="p", protocol="vllm", urls=("http://127.0.0.1:9",), cooldown_s=cooldown_s)
        assert config.max_cooldown_s is None and config.effective_max_cooldown_s == cap
