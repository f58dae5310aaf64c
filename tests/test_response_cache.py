"""Response cache: exact repeats answered without the engine, in memory or in a real Redis.

Every app serves a static engine whose ``score`` is wrapped to count calls, so "the engine was
not called" is observed, not inferred from a header.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import pytest
import redis
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.security.auth import generate_key, hash_key
from schemas.config import (
    ApiKeyConfig,
    AuthConfig,
    CacheConfig,
    LimitsConfig,
    Settings,
    StaticEngineConfig,
)
from tests.conftest import free_port
from tests.test_ratelimit_redis import redis_url  # noqa: F401  (the real redis-server fixture)

KEYS = {"a": generate_key(), "b": generate_key(), "limited": generate_key()}
DOCS = ["alpha beta", "gamma", "delta"]
BODY: dict[str, Any] = {"model": "m", "query": "q", "documents": DOCS}


class Counting:
    def __init__(self, client: TestClient, model: str = "m") -> None:
        self.calls = 0
        engine = client.app.state.registry.get(model).engine
        original = engine.score

        async def score(job: Any) -> Any:
            self.calls += 1
            return await original(job)

        engine.score = score


@contextmanager
def gateway(
    cache: CacheConfig | None = None, *, keys: bool = False, **limits: Any
) -> Iterator[tuple[TestClient, Counting]]:
    auth = AuthConfig()
    if keys:
        auth = AuthConfig(
            keys=tuple(
                ApiKeyConfig(id=name, hash=hash_key(key), models=("*",), rpm=2 if name == "limited" else None)
                for name, key in KEYS.items()
            )
        )
    settings = Settings(
        models=(StaticEngineConfig(name="m", aliases=("m-alias",), scores={"gamma": 0.9}),),
        auth=auth,
        limits=LimitsConfig(**limits),
        cache=cache if cache is not None else CacheConfig(enabled=True),
    )
    with TestClient(create_app(settings, configure_logs=False)) as client:
        yield client, Counting(client)


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def test_off_by_default() -> None:
    with gateway(CacheConfig()) as (client, engine):
        for _ in range(2):
            resp = client.post("/v2/rerank", json=BODY)
            assert resp.status_code == 200 and "x-cache" not in resp.headers
    assert engine.calls == 2


def test_a_repeat_is_answered_without_the_engine() -> None:
    with gateway() as (client, engine):
        first = client.post("/v2/rerank", json=BODY)
        second = client.post("/v2/rerank", json=BODY, headers={"x-request-id": "repeat-1"})
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "hit")
    assert engine.calls == 1
    # The same answer under the new request's id.
    assert second.json()["id"] == "repeat-1" == second.headers["x-request-id"]
    assert {**first.json(), "id": None} == {**second.json(), "id": None}
    assert second.headers["x-inference-time-ms"] == "0.00"


@pytest.mark.parametrize(
    ("route", "change"),
    [
        ("/v2/rerank", {"query": "other"}),
        ("/v2/rerank", {"documents": list(reversed(DOCS))}),
        ("/v2/rerank", {"top_n": 1}),
        ("/v2/rerank", {"return_documents": True}),
        ("/v2/rerank", {"max_tokens_per_doc": 5}),
        ("/v2/rerank", {"max_chunks_per_doc": 2}),
        ("/v2/rerank", {"instruction": "find definitions"}),
        ("/v2/rerank", {"documents": [{"text": d, "t": d} for d in DOCS], "rank_fields": ["t"]}),
        ("/v1/rerank", {}),  # another API version: another response shape
    ],
)
def test_every_scoring_parameter_is_in_the_key(route: str, change: dict[str, Any]) -> None:
    with gateway() as (client, engine):
        assert client.post("/v2/rerank", json=BODY).headers["x-cache"] == "miss"
        resp = client.post(route, json={**BODY, **change})
        assert resp.status_code == 200, resp.text
    assert resp.headers["x-cache"] == "miss" and engine.calls == 2


def test_an_alias_and_priority_do_not_change_the_key() -> None:
    with gateway() as (client, engine):
        client.post("/v2/rerank", json=BODY)
        assert client.post("/v2/rerank", json={**BODY, "model": "m-alias"}).headers["x-cache"] == "hit"
        assert client.post("/v2/rerank", json={**BODY, "priority": 7}).headers["x-cache"] == "hit"
    assert engine.calls == 1


def test_entries_expire_after_ttl_and_the_lru_evicts(monkeypatch: pytest.MonkeyPatch) -> None:
    # The TTL runs on a clock the test steps: a loaded machine taking longer than the TTL between
    # two requests must not turn the expected hit into a miss.
    from gateway.serving import cache as cache_module

    now = [1000.0]
    monkeypatch.setattr(cache_module, "_now", lambda: now[0])
    with gateway(CacheConfig(enabled=True, ttl_s=0.3, max_entries=2)) as (client, engine):
        client.post("/v2/rerank", json=BODY)
        now[0] += 0.29
        assert client.post("/v2/rerank", json=BODY).headers["x-cache"] == "hit"
        now[0] += 0.02  # 0.31 s after the answer was stored: past the TTL
        assert client.post("/v2/rerank", json=BODY).headers["x-cache"] == "miss"
        assert engine.calls == 2
        for query in ("q2", "q3"):  # two newer entries push the oldest out (max_entries = 2)
            client.post("/v2/rerank", json={**BODY, "query": query})
        assert client.post("/v2/rerank", json=BODY).headers["x-cache"] == "miss"


def test_never_shared_across_keys_unless_configured() -> None:
    with gateway(keys=True) as (client, engine):
        assert client.post("/v2/rerank", json=BODY, headers=bearer("a")).headers["x-cache"] == "miss"
        assert client.post("/v2/rerank", json=BODY, headers=bearer("b")).headers["x-cache"] == "miss"
        assert client.post("/v2/rerank", json=BODY, headers=bearer("a")).headers["x-cache"] == "hit"
        assert engine.calls == 2
    with gateway(CacheConfig(enabled=True, shared_across_keys=True), keys=True) as (client, engine):
        assert client.post("/v2/rerank", json=BODY, headers=bearer("a")).headers["x-cache"] == "miss"
        assert client.post("/v2/rerank", json=BODY, headers=bearer("b")).headers["x-cache"] == "hit"
        assert engine.calls == 1


def test_hits_count_toward_rpm_and_usage_but_charge_no_tokens() -> None:
    with gateway(keys=True) as (client, engine):
        assert client.post("/v2/rerank", json=BODY, headers=bearer("limited")).headers["x-cache"] == "miss"
        assert client.post("/v2/rerank", json=BODY, headers=bearer("limited")).headers["x-cache"] == "hit"
        assert client.post("/v2/rerank", json=BODY, headers=bearer("limited")).status_code == 429  # rpm = 2
        metrics = client.get("/metrics").text
    assert engine.calls == 1
    assert 'rerank_requests_total{key="limited",model="m",status="200"} 2.0' in metrics
    assert 'rerank_documents_total{key="limited",model="m"} 6.0' in metrics
    # The static engine's count for the miss alone (4 document words + 3 x 1 query word).
    assert 'rerank_tokens_total{key="limited",model="m"} 7.0' in metrics
    assert 'rerank_response_cache_requests_total{model="m",result="hit"} 1.0' in metrics


def test_invalid_requests_are_refused_before_the_cache() -> None:
    with gateway() as (client, _):
        client.post("/v2/rerank", json=BODY)
        resp = client.post("/v2/rerank", json={**BODY, "query": "  "})
        assert resp.status_code == 422 and "x-cache" not in resp.headers


@pytest.mark.slow
def test_redis_backend_is_shared_by_replicas_and_expires(redis_url: str) -> None:
    # Neither the Redis timeout nor the TTL may be what a loaded CI machine runs into: a redis-server
    # starved for 0.5 s (the default redis_timeout_s) is "Redis unreachable", a correct miss, and a
    # sleep past a short TTL races the requests. So the timeout is generous, the TTL the gateway
    # set is read from Redis, and the expiry is Redis's own, brought forward with PEXPIRE.
    cache = CacheConfig(enabled=True, backend="redis", redis_url=redis_url, ttl_s=60)
    with (
        closing(redis.Redis.from_url(redis_url, socket_timeout=30)) as store,
        gateway(cache, redis_timeout_s=30) as (one, engine_one),
        gateway(cache, redis_timeout_s=30) as (two, engine_two),
    ):
        body = {**BODY, "query": f"redis {time.time()}"}  # fresh key whatever ran before
        before = set(store.keys("rerank-gateway:cache:*"))
        assert one.post("/v2/rerank", json=body).headers["x-cache"] == "miss"
        hit = two.post("/v2/rerank", json=body)
        assert hit.headers["x-cache"] == "hit" and hit.json()["results"][0]["index"] == 1
        assert (engine_one.calls, engine_two.calls) == (1, 0)
        (entry,) = set(store.keys("rerank-gateway:cache:*")) - before
        assert 0 < store.pttl(entry) <= 60_000  # SET ... PX ttl: Redis drops it, no sweeper needed
        store.pexpire(entry, 1)
        time.sleep(0.01)
        assert two.post("/v2/rerank", json=body).headers["x-cache"] == "miss"
        assert engine_two.calls == 1


def test_redis_down_is_a_miss_not_an_error() -> None:
    cache = CacheConfig(enabled=True, backend="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with gateway(cache, redis_timeout_s=0.2) as (client, engine):
        for _ in range(2):
            resp = client.post("/v2/rerank", json=BODY)
            assert resp.status_code == 200 and resp.headers["x-cache"] == "miss"
    assert engine.calls == 2


def test_redis_backend_needs_a_url() -> None:
    from gateway.config.settings import ConfigError

    with pytest.raises(ConfigError, match="cache.redis_url or limits.redis_url"):
        create_app(Settings(models=(StaticEngineConfig(name="m"),), cache=CacheConfig(enabled=True, backend="redis")))
