"""Response cache: an exact repeat of a rerank request is answered without the engine.

Off by default (``[cache] enabled = true``). The key is a SHA-256 over everything that shapes
the answer: the API version, the canonical model name (aliases resolved) and its fingerprint
(:mod:`gateway.serving.fingerprint`: the config, checkpoint files and code versions behind it), the whole request
body except ``model`` and ``priority`` (so query, documents, rank_fields, top_n,
return_documents, max_tokens_per_doc, max_chunks_per_doc and any field added later are all
part of it), the effective instruction, truncation and chunk cap after defaults, and the
caller's API key id unless ``shared_across_keys = true``. Only the hash is used as the key; the
stored value is the encoded response (which holds document text when ``return_documents`` was
asked), so a Redis backend must be as private as the gateway itself.

Backends: ``memory`` is :class:`cachetools.TTLCache` (LRU eviction with a per-entry TTL) in
this process; ``redis`` is ``SET ... PX ttl`` in a Redis shared by every replica. A cache that
fails (Redis down) is a miss, logged at most once per 30 s: the cache never fails a request.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Protocol

import msgspec
import structlog
from cachetools import TTLCache

from gateway.config.settings import ConfigError
from schemas.config import Settings

__all__ = ("CachedAnswer", "ResponseCache", "build_cache", "cache_key")

log = structlog.get_logger("gateway.cache")

_REDIS_PREFIX = "rerank-gateway:cache:"
_WARN_EVERY_S = 30.0
_encode = msgspec.json.Encoder(order="deterministic").encode


class CachedAnswer(msgspec.Struct, frozen=True):
    """What a hit needs to answer: the response body (its ``id`` is replaced) and log fields."""

    response: bytes
    documents: int
    items: int
    input_tokens: int
    # The chain target that computed the answer (its x-rerank-target header on a hit); None for
    # a model served by its own engine. Entries written before this field decode with None.
    target: str | None = None


_answer_encoder = msgspec.msgpack.Encoder()
_answer_decoder = msgspec.msgpack.Decoder(CachedAnswer)


def cache_key(
    *, scope: str, api_version: str, model: str, request: Any, effective: dict[str, Any], fingerprint: str
) -> str:
    """Hex SHA-256 naming one exact request for one caller scope, to one model as configured now."""
    body = msgspec.to_builtins(request)
    body.pop("model", None)
    body.pop("priority", None)  # accepted for compatibility, changes nothing in the answer
    canonical = _encode(
        {
            "scope": scope,
            "api_version": api_version,
            "model": model,
            "fingerprint": fingerprint,
            "body": body,
            "effective": effective,
        }
    )
    return hashlib.sha256(canonical).hexdigest()


class _Backend(Protocol):
    async def get(self, key: str) -> bytes | None: ...
    async def set(self, key: str, value: bytes) -> None: ...
    async def close(self) -> None: ...


def _now() -> float:
    """The memory backend's TTL clock, read through the module so a test can step it (no sleeps)."""
    return time.monotonic()


class _MemoryBackend:
    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self._entries: TTLCache[str, bytes] = TTLCache(maxsize=max_entries, ttl=ttl_s, timer=lambda: _now())

    async def get(self, key: str) -> bytes | None:
        return self._entries.get(key)

    async def set(self, key: str, value: bytes) -> None:
        self._entries[key] = value

    async def close(self) -> None:
        self._entries.clear()


class _RedisBackend:
    def __init__(self, url: str, ttl_s: float, timeout_s: float) -> None:
        import redis.asyncio

        self._client = redis.asyncio.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._ttl_ms = max(1, math.ceil(ttl_s * 1000))

    async def get(self, key: str) -> bytes | None:
        value = await self._client.get(_REDIS_PREFIX + key)
        if value is None:
            return None
        assert not isinstance(value, str)  # the client is made without decode_responses: it answers bytes
        return bytes(value)

    async def set(self, key: str, value: bytes) -> None:
        await self._client.set(_REDIS_PREFIX + key, value, px=self._ttl_ms)

    async def close(self) -> None:
        await self._client.aclose()


class ResponseCache:
    """Get/put answers by key; every backend failure is a miss (or a skipped put)."""

    def __init__(self, backend: _Backend, *, shared_across_keys: bool, max_entry_bytes: int) -> None:
        self._backend = backend
        self.shared_across_keys = shared_across_keys
        self._max_entry_bytes = max_entry_bytes
        self._last_warning = -math.inf

    async def get(self, key: str) -> CachedAnswer | None:
        try:
            raw = await self._backend.get(key)
        except Exception as exc:  # noqa: BLE001  # a broken cache must never fail a request
            self._warn(exc)
            return None
        if raw is None:
            return None
        try:
            return _answer_decoder.decode(raw)
        except msgspec.DecodeError:  # another version's entry: recompute
            return None

    async def put(self, key: str, answer: CachedAnswer) -> None:
        raw = _answer_encoder.encode(answer)
        if len(raw) > self._max_entry_bytes:
            return
        try:
            await self._backend.set(key, raw)
        except Exception as exc:  # noqa: BLE001  # a broken cache must never fail a request
            self._warn(exc)

    async def close(self) -> None:
        try:
            await self._backend.close()
        except Exception as exc:  # noqa: BLE001  # nor the shutdown
            self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY_S:
            self._last_warning = now
            # The class only: a Redis error message may quote the URL with its password.
            log.warning("response_cache_unavailable", error=type(exc).__name__, action="answering without the cache")


def build_cache(settings: Settings) -> ResponseCache | None:
    """The configured cache, or None when it is off. Opens no connection yet (Redis connects lazily)."""
    config = settings.cache
    if not config.enabled:
        return None
    if config.backend == "redis":
        url = config.redis_url or settings.limits.redis_url
        if not url:  # unset or empty ("" from an empty RERANK_*__REDIS_URL)
            raise ConfigError('invalid config: cache.backend = "redis" needs cache.redis_url or limits.redis_url')
        backend: _Backend = _RedisBackend(url, config.ttl_s, settings.limits.redis_timeout_s)
    else:
        backend = _MemoryBackend(config.max_entries, config.ttl_s)
    return ResponseCache(backend, shared_across_keys=config.shared_across_keys, max_entry_bytes=config.max_entry_bytes)
