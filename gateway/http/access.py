"""Access control around every route but the open ones: API key (401), limits (429), usage.

It is app-level middleware, so a route added later is protected by default; only the paths in
:data:`OPEN_PATHS` (health, readiness, the OpenAPI schema, the model list and ``/metrics``)
are served without a key. The model scope (403) needs the request's model, so the service
checks it through :func:`gateway.security.auth.authorize_model` once the model is resolved.

Order: authenticate -> admit under the key's limits -> run the handler -> release the
concurrency slot, charge the tokens the engine counted, count the request in ``/metrics``.
Failed requests count too (toward rpm, and in the metrics by status).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Final

import msgspec
import structlog
from litestar import Litestar
from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.settings import ConfigError
from gateway.errors import (
    AdminOnlyError,
    GatewayError,
    KeyNotFoundError,
    RateLimitedError,
    RateLimitStoreError,
    classify,
)
from gateway.http.middleware import cancelled_status, log_fields, request_id
from gateway.observability import tracing
from gateway.observability.metrics import ANONYMOUS, UNAUTHENTICATED, UsageMetrics
from gateway.security.admin import SharedKeys, key_info
from gateway.security.auth import KeyStore, RequestAccess, check_exposure, request_access, scope_warnings
from gateway.security.quotas import quota_rules
from gateway.security.ratelimit import KeyLimiter
from gateway.security.ratelimit_backend import Admission
from gateway.serving.telemetry import GatewayTelemetry, request_timing
from schemas.admin import KeyInfo
from schemas.config import ApiKeyConfig, Settings
from schemas.rerank import ErrorBody

log = structlog.get_logger("gateway.access")

__all__ = ("OPEN_PATHS", "AccessControl", "AccessMiddleware")

# /info (TEI's model info) is as public as the model list.
OPEN_PATHS: Final = frozenset({"/health", "/ready", "/metrics", "/v1/models", "/models", "/info"})
_OPEN_PREFIXES: Final = ("/schema",)
_ADMIN_PREFIX: Final = "/admin/"


class AccessControl:
    """The keys, the limiter and the usage counters of one app (``app.state.access``)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.keys = KeyStore(settings.auth.keys)
        # A Redis lease outlives the longest request, so only a dead replica's slots expire.
        longest = max((m.timeout_s for m in settings.models), default=60.0)
        self.limiter = KeyLimiter(settings.limits, lease_s=longest + 60.0)
        self.metrics = UsageMetrics()
        self.telemetry = GatewayTelemetry(self.metrics.registry, live=self.metrics.live)
        # The admin API's keys (gateway.security.admin), served with the file's; file wins an id.
        self.shared_keys: SharedKeys | None = None
        self._admin_keys: tuple[ApiKeyConfig, ...] = ()
        self._version = -1
        self._sync_lock = asyncio.Lock()
        self._sync_task: asyncio.Task[None] | None = None
        self._last_sync_warning = -math.inf

    async def start(self) -> None:
        await self.limiter.start()
        # The admin API is on where the config has an admin key (the same file on every replica):
        # only then is there a shared key store to read, and a Redis to poll.
        if self.limiter.client is not None and any(k.admin for k in self._settings.auth.keys):
            self.shared_keys = SharedKeys(self.limiter.client)
            await self.sync_keys_quietly()  # Redis down at start: the file's keys, and the poll retries
            self._sync_task = asyncio.create_task(self._poll(), name="admin-keys-sync")

    async def stop(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
            await asyncio.gather(self._sync_task, return_exceptions=True)
            self._sync_task = None
        await self.limiter.stop()

    @property
    def file_ids(self) -> frozenset[str]:
        return frozenset(k.id for k in self._settings.auth.keys)

    def key_infos(self) -> list[KeyInfo]:
        """Every key served, file's first: what the admin API lists (no secret, no hash)."""
        files = self.file_ids
        return [key_info(k, "file" if k.id in files else "admin") for k in self.keys.keys]

    def key_config(self, key_id: str) -> ApiKeyConfig:
        for key in self.keys.keys:
            if key.id == key_id:
                return key
        raise KeyNotFoundError(f"no key '{key_id}'")

    def _merged(self, file_keys: tuple[ApiKeyConfig, ...]) -> KeyStore:
        ids = {k.id for k in file_keys}
        hashes = {k.hash for k in file_keys}
        shared = []
        for key in self._admin_keys:
            if key.id in ids or key.hash in hashes:
                log.warning(
                    "admin_key_shadowed", key_id=key.id, reason="the config file has a key with this id or hash"
                )
                continue
            shared.append(key)
        return KeyStore((*file_keys, *shared))

    async def sync_keys(self) -> None:
        """Re-read the admin API's keys when their version moved (one GET when it did not)."""
        if self.shared_keys is None:
            return
        # The poll task and an admin handler may both sync: serialized, the later load always wins.
        async with self._sync_lock:
            await self._sync_keys(self.shared_keys)

    async def _sync_keys(self, shared_keys: SharedKeys) -> None:
        if await shared_keys.version() == self._version:
            return
        version, keys = await shared_keys.load()
        old = {k.id for k in self._admin_keys}
        self._admin_keys, self._version = keys, version
        self.keys = self._merged(self._settings.auth.keys)
        new = {k.id for k in keys}
        if old != new or version:
            log.info(
                "admin_keys_synced", version=version, keys=len(new), added=sorted(new - old), removed=sorted(old - new)
            )

    async def sync_keys_quietly(self) -> bool:
        try:
            await self.sync_keys()
        except Exception as exc:  # noqa: BLE001 -- Redis down or slow: keep the keys we have
            now = time.monotonic()
            if now - self._last_sync_warning >= 30.0:
                self._last_sync_warning = now
                log.warning("admin_keys_sync_failed", error=type(exc).__name__)
            return False
        return True

    async def _poll(self) -> None:
        interval = self._settings.auth.sync_interval_s
        failures = 0
        while True:
            # While Redis fails, poll less (up to every 30 s): a hung store is not asked 4 times a second.
            await asyncio.sleep(min(30.0, interval * 2**failures) if failures else interval)
            failures = 0 if await self.sync_keys_quietly() else min(failures + 1, 16)

    def reload_keys(self, load: Callable[[], Settings]) -> bool:
        """Swap in ``auth.keys`` from a fresh read of the config (SIGHUP); nothing else changes.

        One assignment swaps the store, so a request sees either the old keys or the new ones;
        requests already admitted keep the key they were admitted with. A config that does not
        load, repeats an id or hash, or would leave a public address without keys is refused
        with one log line and the old keys stay.
        """
        try:
            fresh = load()
            # Only the keys change: check exposure against the address actually bound.
            check_exposure(msgspec.structs.replace(fresh, server=self._settings.server))
            KeyStore(fresh.auth.keys)  # the file alone must be valid (ids and hashes once each)
            store = self._merged(fresh.auth.keys)
        except (ConfigError, ValueError, OSError) as exc:  # OSError: config unreadable
            reason = str(exc) if isinstance(exc, ValueError) else f"cannot read the config ({type(exc).__name__})"
            log.error("keys_reload_rejected", error=reason, kept=len(self._settings.auth.keys))
            return False
        old = {k.id for k in self._settings.auth.keys}
        new = {k.id for k in fresh.auth.keys}
        self.keys = store
        self._settings = msgspec.structs.replace(self._settings, auth=fresh.auth)
        ignored = [
            name
            for name in ("logging", "limits", "cache", "dialects", "models")
            if getattr(fresh, name) != getattr(self._settings, name)
        ]
        for warning in scope_warnings(msgspec.structs.replace(fresh, models=self._settings.models)):
            log.warning("keys_scope_matches_no_model", warning=warning)
        log.info(
            "keys_reloaded",
            keys=len(new),
            added=sorted(new - old),
            removed=sorted(old - new),
            **({"restart_needed_for": ignored} if ignored else {}),
        )
        return True


def _is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(_OPEN_PREFIXES)


class AccessMiddleware:
    """ASGI middleware (Litestar app-level) enforcing :class:`AccessControl` per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or _is_open(scope["path"]):  # a str enum: equal to "http"
            await self.app(scope, receive, send)
            return
        control: AccessControl = Litestar.from_scope(scope).state.access
        access = RequestAccess(key=None, label=ANONYMOUS)
        admission: Admission | None = None
        status: int | None = None  # set when the response starts
        quotas = False  # the key has quotas: its usage is charged before the answer goes out
        charged = False
        refused = False  # a quota refused the scored answer: its body is dropped

        async def send_with_limits(message: Message) -> None:
            nonlocal status, charged, refused
            if refused:
                return
            if message["type"] == "http.response.start":
                status = message["status"]
                usage = access.usage
                if quotas and status == 200 and usage is not None and access.key is not None and access.model:
                    charged = True
                    try:
                        await control.limiter.charge(
                            access.key,
                            access.model,
                            documents=usage.documents,
                            tokens=usage.tokens,
                            search_units=usage.search_units,
                            strict=True,
                        )
                    except (RateLimitedError, RateLimitStoreError) as exc:
                        refused = True
                        status = classify(exc)
                        if isinstance(exc, RateLimitedError):
                            control.metrics.record_rate_limited(access.label, exc.limit)
                            log_fields()["rate_limited"] = exc.limit
                        await _send_error(send, scope, exc, status)
                        return
                if admission is not None:
                    headers = MutableScopeHeaders.from_message(message)
                    used = access.usage.tokens if access.usage else 0
                    for name, value in admission.headers(tokens_used=used).items():
                        headers[name] = value
            await send(message)

        with request_access(access), request_timing() as timing:
            try:
                with tracing.span("auth"):  # key lookup, rate limits, quota check
                    keys = control.keys
                    if keys.enabled:
                        access.label = UNAUTHENTICATED
                        key = keys.authenticate(scope["headers"])
                        access.key, access.label = key, key.id
                        log_fields()["key_id"] = key.id
                        if scope["path"].startswith(_ADMIN_PREFIX):
                            if not key.admin:
                                raise AdminOnlyError(f"API key '{key.id}' is not an admin key (admin = true)")
                        else:
                            quotas = bool(quota_rules(key))
                            admission = await control.limiter.admit(key)
                    elif scope["path"].startswith(_ADMIN_PREFIX):
                        raise AdminOnlyError(
                            "the admin API needs an admin key: add one with admin = true to [[auth.keys]]"
                        )
                timing.admission_s = time.perf_counter() - timing.started
                await self.app(scope, receive, send_with_limits)
            except Exception as exc:
                # Raised before the handler ran (401, 429, 503): Litestar's outer handler answers.
                if status is None:
                    status = classify(exc)
                if isinstance(exc, RateLimitedError):
                    control.metrics.record_rate_limited(access.label, exc.limit)
                    log_fields()["rate_limited"] = exc.limit
                raise
            finally:
                usage = access.usage
                if admission is not None:
                    # A quota-refused answer was dropped: its tokens count nowhere, tpm included.
                    await control.limiter.finish(admission, usage.tokens if usage and not refused else 0)
                if not charged and status == 200 and usage is not None and access.key is not None and access.model:
                    # No quota: the usage ledger only, once the answer is out (an outage is logged).
                    await control.limiter.charge(
                        access.key,
                        access.model,
                        documents=usage.documents,
                        tokens=usage.tokens,
                        search_units=usage.search_units,
                        strict=False,
                    )
                # No status: cancelled before any response, by the client leaving (499) or the
                # server's shutdown (503, answered by gateway.http.middleware).
                control.metrics.record_request(access.label, access.model, status or cancelled_status(scope))
                control.telemetry.observe(timing, model=access.model, route=scope.get("path_template", scope["path"]))
                if tracing.TRACER is not None and access.model is not None:  # on the request's span
                    tracing.annotate(
                        **{
                            "rerank.model": access.model,
                            **(
                                {
                                    "rerank.documents": usage.documents,
                                    "rerank.tokens": usage.tokens,
                                    "rerank.search_units": usage.search_units,
                                }
                                if usage is not None
                                else {}
                            ),
                        }
                    )
                if usage is not None and access.model is not None and not refused:  # refused: not counted
                    control.metrics.record_usage(
                        access.label,
                        access.model,
                        documents=usage.documents,
                        tokens=usage.tokens,
                        search_units=usage.search_units,
                    )


async def _send_error(send: Send, scope: Scope, exc: GatewayError, status: int) -> None:
    """The Cohere error body for a refusal decided after the handler answered (a quota)."""
    message = str(exc)
    body = msgspec.json.encode(ErrorBody(message=message, id=request_id(scope), detail=message))
    headers = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (exc.headers or {}).items()]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
