"""The three per-key limits over one storage, memory or Redis (``KeyLimiter`` in
:mod:`gateway.security.ratelimit` picks the storage and handles its outages).

The windows come from the ``limits`` library (its Redis strategies are single Lua scripts: check
and count in one atomic step), not from hand-rolled counters:

- ``rpm``: moving window. Exact: at most ``rpm`` requests in any 60 s, across all replicas.
- ``tpm``: fixed window of 60 s. Tokens are only known after scoring, so a request is admitted
  while the window has budget left and its tokens are charged afterwards with an
  unconditional increment (a request that overshoots is charged in full). A moving window
  would store one Redis list entry per token, hence the fixed window for tokens.
- ``max_concurrent``: a counter in memory; in Redis a sorted set of leases (one per request,
  scored by its expiry on Redis' clock) behind a small redis-py script. ``limits`` has no
  concurrency limiter, and leases make a crashed replica's slots expire instead of leaking.

An :class:`Admission` holds what an admitted request took (a concurrency slot) and its windows,
as sent in the X-RateLimit-* headers.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from limits import RateLimitItemPerMinute
from limits.aio.storage import Storage
from limits.aio.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter
from limits.errors import StorageError

from gateway.errors import RateLimitedError
from schemas.config import ApiKeyConfig

__all__ = ("Admission", "Window")

_REDIS_PREFIX = "rerank-gateway"


@dataclass(slots=True, frozen=True)
class Window:
    """One limit's state after admission, as sent in X-RateLimit-* headers."""

    limit: int
    remaining: int
    reset_s: int  # seconds until the window frees budget


def _window(limit: int, remaining: int, reset_at: float) -> Window:
    return Window(limit, max(0, remaining), max(1, math.ceil(reset_at - time.time())))


def _headers(window: Window, suffix: str = "") -> dict[str, str]:
    return {
        f"X-RateLimit-Limit{suffix}": str(window.limit),
        f"X-RateLimit-Remaining{suffix}": str(window.remaining),
        f"X-RateLimit-Reset{suffix}": str(window.reset_s),
    }


def _refused(message: str, window: Window, *, limit: str, tokens: Window | None = None) -> RateLimitedError:
    headers = {"Retry-After": str(window.reset_s), **_headers(window)}
    if tokens is not None:
        headers.update(_headers(tokens, "-Tokens"))
    return RateLimitedError(message, headers=headers, limit=limit)


@dataclass(slots=True)
class Admission:
    """An admitted request: what it holds (a concurrency slot) and its windows for headers."""

    key: ApiKeyConfig
    backend: _Backend | None
    requests: Window | None = None
    tokens: Window | None = None
    lease: str | None = None

    def headers(self, tokens_used: int = 0) -> dict[str, str]:
        """X-RateLimit-* for the response: the request window (else the token window) plus
        ``-Tokens`` variants when the key has a tpm. Remaining tokens include this request's."""
        out: dict[str, str] = {}
        tokens = self.tokens
        if tokens is not None:
            tokens = Window(tokens.limit, max(0, tokens.remaining - tokens_used), tokens.reset_s)
            out.update(_headers(tokens, "-Tokens"))
        main = self.requests or tokens
        if main is not None:
            out.update(_headers(main))
        return out


class _Slots(Protocol):
    async def acquire(self, key_id: str, limit: int) -> str | None: ...
    async def release(self, key_id: str, lease: str) -> None: ...


class _LocalSlots:
    def __init__(self) -> None:
        self._in_flight: defaultdict[str, int] = defaultdict(int)

    async def acquire(self, key_id: str, limit: int) -> str | None:
        if self._in_flight[key_id] >= limit:
            return None
        self._in_flight[key_id] += 1
        return key_id

    async def release(self, key_id: str, lease: str) -> None:
        self._in_flight[key_id] = max(0, self._in_flight[key_id] - 1)


# Leases are scored by their expiry in ms on Redis' own clock (TIME), so replicas' clocks do
# not matter; expired leases (a replica that died mid-request) are dropped before counting.
_ACQUIRE_LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
    return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""


class _RedisSlots:
    def __init__(self, client: Any, lease_ms: int) -> None:
        from redis.exceptions import RedisError

        self._client = client
        self._lease_ms = lease_ms
        self._script = client.register_script(_ACQUIRE_LEASE)
        self._errors = (RedisError, OSError)

    async def acquire(self, key_id: str, limit: int) -> str | None:
        lease = uuid.uuid4().hex
        try:
            ok = await self._script(keys=[f"{_REDIS_PREFIX}:inflight:{key_id}"], args=[limit, self._lease_ms, lease])
        except self._errors as exc:
            raise StorageError(exc) from exc
        return lease if ok == 1 else None

    async def release(self, key_id: str, lease: str) -> None:
        try:
            await self._client.zrem(f"{_REDIS_PREFIX}:inflight:{key_id}", lease)
        except self._errors as exc:
            raise StorageError(exc) from exc


class _Backend:
    """The three limits over one storage (memory or Redis)."""

    def __init__(self, storage: Storage, slots: _Slots) -> None:
        self._moving = MovingWindowRateLimiter(storage)
        self._fixed = FixedWindowRateLimiter(storage)
        self._slots = slots

    async def admit(self, key: ApiKeyConfig) -> Admission:
        admission = Admission(key, self)
        if key.max_concurrent is not None:
            admission.lease = await self._slots.acquire(key.id, key.max_concurrent)
            if admission.lease is None:
                window = Window(key.max_concurrent, 0, 1)
                raise _refused(
                    f"API key '{key.id}' already has {key.max_concurrent} requests in flight "
                    "(max_concurrent); retry when one finishes",
                    window,
                    limit="max_concurrent",
                )
        try:
            if key.tpm is not None:
                item = RateLimitItemPerMinute(key.tpm)
                stats = await self._fixed.get_window_stats(item, key.id)
                # An unused window does not exist yet: it opens, for 60 s, with the first charge.
                reset_at = stats.reset_time if stats.remaining < key.tpm else time.time() + 60
                admission.tokens = _window(key.tpm, stats.remaining, reset_at)
                if stats.remaining <= 0:
                    raise _refused(
                        f"API key '{key.id}' used its {key.tpm} tokens per minute; "
                        f"retry in {admission.tokens.reset_s}s",
                        admission.tokens,
                        limit="tpm",
                    )
            if key.rpm is not None:
                item = RateLimitItemPerMinute(key.rpm)
                admitted = await self._moving.hit(item, key.id)
                stats = await self._moving.get_window_stats(item, key.id)
                admission.requests = _window(key.rpm, stats.remaining, stats.reset_time)
                if not admitted:
                    raise _refused(
                        f"API key '{key.id}' is over its limit of {key.rpm} requests per minute; "
                        f"retry in {admission.requests.reset_s}s",
                        admission.requests,
                        limit="rpm",
                        tokens=admission.tokens,
                    )
        except BaseException:
            await _uninterrupted(self._release_quietly(admission))
            raise
        return admission

    async def finish(self, admission: Admission, tokens: int) -> None:
        key = admission.key
        try:
            if admission.lease is not None:
                lease, admission.lease = admission.lease, None
                await self._slots.release(key.id, lease)
        finally:
            if key.tpm is not None and tokens > 0:
                # hit() increments even past the limit: the overshoot is charged, not dropped.
                await self._fixed.hit(RateLimitItemPerMinute(key.tpm), key.id, cost=tokens)

    async def _release_quietly(self, admission: Admission) -> None:
        if admission.lease is None:
            return
        try:
            await self._slots.release(admission.key.id, admission.lease)
        except StorageError:
            pass  # the lease expires on its own in Redis
        admission.lease = None


async def _uninterrupted(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end even if this task is cancelled meanwhile, then re-raise.

    A shielded anyio scope does not hold off asyncio's own ``Task.cancel()``: a request cancelled
    twice (its client left, then the server shuts down) had the second cancellation interrupt a
    slot's release in flight (a Redis ZREM), so the slot stayed taken until its lease expired.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    with anyio.CancelScope(shield=True):  # anyio's own cancellations are not delivered here at all
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                cancelled = True  # re-raised once the work is done
    if cancelled:
        raise asyncio.CancelledError
    task.result()
