"""Quota windows with Redis are judged by Redis's clock, not each replica's (real redis-server).

Two replicas whose clocks straddle midnight -- one a second before, one a second after -- used
to charge one day's quota in two windows ("2026-01-01" and "2026-01-02"): a key with 100 tokens a
day got 120 through. Each store now reads Redis's ``TIME`` and both count in the window of
Redis's own date, so the second charge is refused and both report the same usage.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from gateway.errors import RateLimitedError
from gateway.security import quotas
from gateway.security.auth import hash_key
from gateway.security.quotas import Calendar, RedisQuotaStore
from schemas.config import ApiKeyConfig
from tests.test_ratelimit_redis import on_flushed_redis as _run
from tests.test_ratelimit_redis import redis_url  # noqa: F401  (the real redis-server fixture)

KEY = ApiKeyConfig(id="team-a", hash=hash_key("rk-team-a"), models=("*",), tokens_per_day=100)


def _fixed(at: datetime) -> Calendar:
    return Calendar("UTC", clock=lambda: at)


def test_replicas_either_side_of_midnight_share_one_window(redis_url: str) -> None:
    async def body(client: Any) -> Any:
        before = RedisQuotaStore(_fixed(datetime(2026, 1, 1, 23, 59, 59, tzinfo=UTC)), client)
        after = RedisQuotaStore(_fixed(datetime(2026, 1, 2, 0, 0, 1, tzinfo=UTC)), client)
        await before.charge(KEY, "m", documents=1, tokens=60, search_units=1)
        with pytest.raises(RateLimitedError, match="tokens_per_day"):
            await after.charge(KEY, "m", documents=1, tokens=60, search_units=1)
        seconds, _ = await client.time()
        return await before.status(KEY), await after.status(KEY), seconds

    mine, theirs, seconds = _run(redis_url, body)
    assert [s.used for s in mine] == [s.used for s in theirs] == [60]
    next_day = datetime.fromtimestamp(seconds, UTC).date() + timedelta(days=1)
    midnight = datetime(next_day.year, next_day.month, next_day.day, tzinfo=ZoneInfo("UTC"))
    assert mine[0].resets_at == theirs[0].resets_at == midnight.isoformat()  # the window of Redis's date


def test_the_clock_is_read_again_once_stale(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(client: Any) -> int:
        store = RedisQuotaStore(_fixed(datetime(2026, 1, 1, tzinfo=UTC)), client)
        reads = 0
        real = client.time

        async def counted() -> Any:
            nonlocal reads
            reads += 1
            return await real()

        client.time = counted
        ticks = iter([0.0, 1.0, quotas.CLOCK_REFRESH_S + 2.0])
        monkeypatch.setattr(quotas, "_monotonic", lambda: next(ticks, quotas.CLOCK_REFRESH_S + 2.0))
        for _ in range(3):
            await store.check(KEY)
        return reads

    assert _run(redis_url, body) == 2  # the first check and the one past the refresh interval
