"""Per-key limits: requests per minute, tokens per minute and requests in flight.

Counters live in this process by default and in Redis when ``limits.redis_url`` is set, so
that every replica behind a load balancer enforces one limit. The windows come from the
``limits`` library (its Redis strategies are single Lua scripts: check and count in one atomic
step), not from hand-rolled counters:

- ``rpm``: moving window. Exact: at most ``rpm`` requests in any 60 s, across all replicas.
- ``tpm``: fixed window of 60 s. Tokens are only known after scoring, so a request is admitted
  while the window has budget left and its tokens are charged afterwards with an
  unconditional increment (a request that overshoots is charged in full). A moving window
  would store one Redis list entry per token, hence the fixed window for tokens.
- ``max_concurrent``: a counter in memory; in Redis a sorted set of leases (one per request,
  scored by its expiry on Redis' clock) behind a small redis-py script. ``limits`` has no
  concurrency limiter, and leases make a crashed replica's slots expire instead of leaking.

Every request that gets past the limits counts toward ``rpm``, whatever its outcome (an
invalid body, a forbidden model, an engine failure); requests refused with 429 do not.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Protocol, TypeVar

import anyio
import structlog
from limits import RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter
from limits.errors import StorageError

from gateway.errors import RateLimitedError, RateLimitStoreError
from gateway.security.quotas import Calendar, MemoryQuotaStore, QuotaStatus, RedisQuotaStore, UsageRow, quota_rules
from schemas.config import ApiKeyConfig, LimitsConfig

__all__ = ("Admission", "KeyLimiter", "Window")

log = structlog.get_logger("gateway.ratelimit")
_T = TypeVar("_T")

_REDIS_PREFIX = "rerank-gateway"
# One warning per this many seconds while Redis is down and limits fall back to memory.
_WARN_EVERY_S = 30.0


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


def _limits_uri(url: str) -> str:
    # `limits` names its async Redis schemes async+redis://, async+rediss://, async+redis+unix://.
    if url.startswith("async+"):
        return url
    if url.startswith("unix://"):
        return "async+redis+" + url
    return "async+" + url


class KeyLimiter:
    """Admits requests under their key's limits; Redis-backed when configured.

    Call :meth:`start` inside the event loop (the app lifespan) and :meth:`stop` at shutdown.
    """

    def __init__(
        self, limits: LimitsConfig, *, lease_s: float = 300.0, clock: Callable[[], datetime] | None = None
    ) -> None:
        self._config = limits
        self._lease_ms = int(lease_s * 1000)
        self._local: _Backend | None = None
        self._shared: _Backend | None = None
        self._client: Any = None
        self._last_warning = -math.inf
        # Quotas (gateway.security.quotas): the same store and outage policy as the limits.
        self.calendar = Calendar(limits.quota_timezone, clock)
        self._local_quotas = MemoryQuotaStore(self.calendar)
        self._shared_quotas: RedisQuotaStore | None = None

    @property
    def client(self) -> Any:
        """The redis-py client once started with ``limits.redis_url`` (else None)."""
        return self._client

    @property
    def shared(self) -> bool:
        return bool(self._config.redis_url)  # "" (an empty RERANK_LIMITS__REDIS_URL) is unset

    async def start(self) -> None:
        self._local = _Backend(MemoryStorage(), _LocalSlots())
        url = self._config.redis_url
        if not url:  # unset or empty: limits in this process, as without the variable
            return
        import redis.asyncio
        from limits.aio.storage import RedisStorage
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        timeout = self._config.redis_timeout_s
        # One immediate retry (a restarted Redis drops pooled connections), no backoff: a
        # request must not wait seconds on an unreachable store. On a connection error only: after
        # a timeout the command may have run (a quota charge, an admin write), and a second send
        # would apply it twice (redis-py's default retries timeouts too).
        retry = Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))
        pool = redis.asyncio.ConnectionPool.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=retry
        )
        self._client = redis.asyncio.Redis(connection_pool=pool, retry=retry)
        # Passed on to redis-py; limits types its **options as scalars only, which these are not.
        redis_options: dict[str, Any] = {"connection_pool": pool, "retry": retry}
        storage = RedisStorage(
            _limits_uri(url),
            implementation="redispy",
            wrap_exceptions=True,
            key_prefix=_REDIS_PREFIX,
            **redis_options,
        )
        self._shared = _Backend(storage, _RedisSlots(self._client, self._lease_ms))
        self._shared_quotas = RedisQuotaStore(self.calendar, self._client)

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose(close_connection_pool=True)
            self._client = None

    async def admit(self, key: ApiKeyConfig) -> Admission:
        """Admit a request of ``key`` or raise 429 (:class:`RateLimitedError`) / 503."""
        if quota_rules(key):  # a used-up quota refuses before any limit counts the request
            await self._quotas(lambda store: store.check(key), "checking quotas")
        if key.rpm is None and key.tpm is None and key.max_concurrent is None:
            return Admission(key, None)
        assert self._local is not None, "KeyLimiter.start() was not called"
        if self._shared is None:
            return await self._local.admit(key)
        try:
            return await self._shared.admit(key)
        except StorageError as exc:
            if self._config.redis_failure == "closed":
                self._warn(exc, "refusing requests (limits.redis_failure = closed)")
                raise RateLimitStoreError(
                    "rate limits cannot be checked right now (limit store unreachable); retry shortly"
                ) from None
            self._warn(exc, "enforcing limits per process (limits.redis_failure = open)")
            return await self._local.admit(key)

    async def charge(
        self, key: ApiKeyConfig, model: str, *, documents: int, tokens: int, search_units: int, strict: bool
    ) -> None:
        """Charge a scored request to its key's quotas and the usage ledger, in one atomic step.

        Raises 429 when the usage would pass a quota (nothing is charged). ``strict``: the
        caller can still refuse the request, so a store outage under ``redis_failure = "closed"``
        raises 503; otherwise (a key without quotas, answered already) an outage is only logged.
        """

        async def work(store: MemoryQuotaStore | RedisQuotaStore) -> None:
            await store.charge(key, model, documents=documents, tokens=tokens, search_units=search_units)

        try:
            await self._quotas(work, "charging usage")
        except RateLimitStoreError:
            if strict:
                raise

    async def quota_status(self, key: ApiKeyConfig) -> list[QuotaStatus]:
        return await self._quotas(lambda store: store.status(key), "reading quotas")

    async def usage(self, start: date, end: date) -> list[UsageRow]:
        return await self._quotas(lambda store: store.usage(start, end), "reading usage")

    async def _quotas(self, call: Callable[[Any], Awaitable[_T]], doing: str) -> _T:
        if self._shared_quotas is None:
            return await call(self._local_quotas)
        try:
            return await call(self._shared_quotas)
        except self._redis_errors() as exc:
            if self._config.redis_failure == "closed":
                self._warn(exc, f"{doing}: refusing (limits.redis_failure = closed)")
                raise RateLimitStoreError(
                    "quotas cannot be checked right now (limit store unreachable); retry shortly"
                ) from None
            self._warn(exc, f"{doing}: in this process only (limits.redis_failure = open)")
            return await call(self._local_quotas)

    @staticmethod
    def _redis_errors() -> tuple[type[Exception], ...]:
        import redis.exceptions

        return (redis.exceptions.RedisError, OSError)

    async def finish(self, admission: Admission, tokens: int) -> None:
        """Release the request's slot and charge its tokens; never raises for a store outage."""
        if admission.backend is None:
            return
        # A disconnected client must not leak a slot, nor a second cancellation (shutdown).
        await _uninterrupted(self._finish(admission.backend, admission, tokens))

    async def _finish(self, backend: _Backend, admission: Admission, tokens: int) -> None:
        try:
            await backend.finish(admission, tokens)
        except StorageError as exc:
            self._warn(exc, "could not release a slot or charge tokens")

    def _warn(self, exc: Exception, consequence: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY_S:
            self._last_warning = now
            # Only the error class: the message could quote the URL, password included.
            log.warning("rate_limit_store_unreachable", error=type(exc.__cause__ or exc).__name__, action=consequence)
