"""Per-key limits: requests per minute, tokens per minute and requests in flight.

Counters live in this process by default and in Redis when ``limits.redis_url`` is set, so
that every replica behind a load balancer enforces one limit. How each limit counts (``rpm`` a
moving window, ``tpm`` a fixed one charged after scoring, ``max_concurrent`` slots or Redis
leases) is :mod:`gateway.security.ratelimit_backend`'s; this module picks the storage, falls
back to memory (or refuses) while Redis is down, and keeps the quotas on the same store.

Every request that gets past the limits counts toward ``rpm``, whatever its outcome (an
invalid body, a forbidden model, an engine failure); requests refused with 429 do not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from datetime import date, datetime
from typing import Any, TypeVar

import structlog
from limits.aio.storage import MemoryStorage
from limits.errors import StorageError

from gateway.errors import RateLimitStoreError
from gateway.security.quotas import Calendar, MemoryQuotaStore, QuotaStatus, RedisQuotaStore, UsageRow, quota_rules
from gateway.security.ratelimit_backend import (
    _REDIS_PREFIX,
    Admission,
    _Backend,
    _LocalSlots,
    _RedisSlots,
    _uninterrupted,
)
from schemas.config import ApiKeyConfig, LimitsConfig

__all__ = ("KeyLimiter",)

log = structlog.get_logger("gateway.ratelimit")
_T = TypeVar("_T")

# One warning per this many seconds while Redis is down and limits fall back to memory.
_WARN_EVERY_S = 30.0


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
