"""The gateway's own tables: [server], [logging], [limits], [auth], [cache], [dialects]."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from .base import ModelName, Positive, PositiveFloat, _Strict


class ServerConfig(_Strict, frozen=True):
    # Address to bind; anything but loopback needs API keys ([auth]) or auth.open = true.
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000  # TCP port to listen on
    # uvicorn is a hard dependency and the faster for a passthrough gateway (one client: granian
    # added 0.7-1.8 ms more, docs/benchmarks/cpu-2026-12-01-granian); granian is optional (extra `granian`).
    runner: Literal["uvicorn", "granian"] = "uvicorn"
    # Connection bounds (gateway.launch.servers): no client holds a descriptor forever.
    keep_alive_timeout_s: PositiveFloat = 5.0  # idle connection, fresh or between requests
    header_read_timeout_s: PositiveFloat = 10.0  # a request's headers, from their first byte
    body_read_timeout_s: PositiveFloat = 30.0  # the whole body, from the headers (then 408)
    # SIGTERM: stop accepting, give in-flight requests this long to finish, then stop engines.
    shutdown_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # A model that failed to load is retried with capped exponential backoff: after
    # load_retry_initial_s, then twice as long each time, at most load_retry_max_s apart.
    load_retry_initial_s: PositiveFloat = 5.0
    load_retry_max_s: PositiveFloat = 300.0  # the longest wait between two load attempts
    # Liveness (/health) answers 503 once every model has been failed or unhealthy this long,
    # so an orchestrator restarts the process; 0 keeps /health 200 whatever the models do.
    liveness_failure_after_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    # Server processes sharing the port. Above 1, per-key limits are per worker unless
    # limits.redis_url is set, and /metrics sums every worker (prometheus multiprocess mode).
    workers: Positive = 1


class LoggingConfig(_Strict, frozen=True):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"  # the gateway's and libraries' log level
    # "json": one JSON object per line on stdout (third-party lines too); "console": for people.
    format: Literal["json", "console"] = "json"


class LimitsConfig(_Strict, frozen=True):
    max_body_bytes: Positive = 20 * 1024 * 1024  # larger request bodies get 413
    max_documents: Positive = 10_000  # documents per request; more get 413
    # Cohere caps documents x chunks at 10,000; we cap the chunks actually produced.
    max_total_chunks: Positive = 10_000
    # Per-key rate limits live in this Redis when set (shared by every replica), else in memory.
    redis_url: str | None = None
    # Redis unreachable: "closed" answers 503, "open" falls back to this process's own counters.
    redis_failure: Literal["open", "closed"] = "closed"
    redis_timeout_s: PositiveFloat = 0.5  # per Redis call; slower counts as Redis unreachable
    # The IANA time zone (e.g. "Europe/Berlin") whose calendar days and months the keys' daily and
    # monthly quotas (and the admin API's usage days) follow.
    quota_timezone: str = "UTC"

    def __post_init__(self) -> None:
        try:
            ZoneInfo(self.quota_timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"quota_timezone: {self.quota_timezone!r} is not an IANA time zone (e.g. 'UTC', 'Europe/Berlin')"
            ) from None


KeyId = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z",
        description="1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
    ),
]
KeyHash = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^sha256:[0-9a-f]{64}\Z",
        description="'sha256:' and 64 lowercase hex digits, as `rerank-gateway keys hash` prints",
    ),
]


class ApiKeyConfig(_Strict, frozen=True):
    """One API key, stored as the SHA-256 of the key (``rerank-gateway keys create``), never the key."""

    id: KeyId  # shown in logs, metrics and errors instead of the key
    hash: KeyHash  # "sha256:" and the key's SHA-256 in hex
    # Canonical model names or globs ("qwen3-*", "*"); aliases are resolved before matching.
    models: Annotated[tuple[ModelName, ...], msgspec.Meta(min_length=1)]
    expires_at: datetime | None = None  # without an offset: UTC
    rpm: Positive | None = None  # requests per minute (moving window)
    tpm: Positive | None = None  # engine-counted input tokens per minute
    max_concurrent: Positive | None = None  # requests in flight at once
    # Quotas over calendar days and months (limits.quota_timezone), enforced exactly: a request
    # whose usage would pass one is refused with 429 and not charged (docs/operating-teams.md).
    tokens_per_day: Positive | None = None  # engine-counted input tokens per calendar day
    tokens_per_month: Positive | None = None  # engine-counted input tokens per calendar month
    search_units_per_day: Positive | None = None  # search units (1 per 100 items scored) per day
    search_units_per_month: Positive | None = None  # search units per calendar month
    # May call the admin API (/admin/v1/...): create, change and revoke keys, read usage.
    admin: bool = False


class AuthConfig(_Strict, frozen=True):
    # Without keys the gateway only serves on loopback unless this is set.
    open: bool = False
    # API keys ([[auth.keys]] entries, from `rerank-gateway keys create`); none: the gateway is open.
    keys: tuple[ApiKeyConfig, ...] = ()
    # How often each replica checks the shared key store (Redis, limits.redis_url) for keys the
    # admin API created, changed or revoked; a change reaches every replica within this.
    sync_interval_s: PositiveFloat = 0.25


class CacheConfig(_Strict, frozen=True):
    """Response cache: exact repeats of a request answered without the engine (off by default)."""

    enabled: bool = False  # off by default: answers only exact repeats, x-cache says which
    # "memory": an LRU with TTL in this process; "redis": shared by every replica.
    backend: Literal["memory", "redis"] = "memory"
    ttl_s: PositiveFloat = 300.0  # how long a stored response is served
    max_entries: Positive = 10_000  # memory backend
    # Responses larger than this (encoded JSON) are not cached.
    max_entry_bytes: Positive = 1024 * 1024
    # Redis URL of the redis backend; None: limits.redis_url.
    redis_url: str | None = None
    # false: one key's cached answers are never served to another key.
    shared_across_keys: bool = False


class DialectsConfig(_Strict, frozen=True):
    """The non-Cohere request dialects (TEI's /rerank body and /info, vLLM's /score)."""

    # The model that serves TEI-shaped requests and GET /info (TEI bodies name no model);
    # None: the first configured model.
    tei_model: ModelName | None = None
    # Cohere's `return_documents` defaults to false, Jina's (and vLLM's /rerank) to true, and both
    # APIs post the same body to the same path: only the model name a client sends tells them
    # apart. A /v1/rerank or /rerank body whose `model` (as sent, before aliases) matches one of
    # these glob patterns and leaves `return_documents` out (or null) gets Jina's default, true;
    # every other body Cohere's, false. ["*"]: true for every such body, an absent model included
    # (a deployment for Jina or vLLM clients); []: Cohere's default everywhere. /v2/rerank is
    # Cohere v2 only and keeps false.
    jina_models: tuple[ModelName, ...] = ("jina-*",)
