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

import time
from collections.abc import Callable
from typing import Final

import msgspec
import structlog

from litestar import Litestar
from litestar.datastructures import MutableScopeHeaders
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.settings import ConfigError
from gateway.errors import RateLimitedError, classify
from gateway.http.middleware import cancelled_status, log_fields
from gateway.observability.metrics import ANONYMOUS, UNAUTHENTICATED, UsageMetrics
from gateway.security.auth import KeyStore, RequestAccess, check_exposure, request_access, scope_warnings
from gateway.security.ratelimit import Admission, KeyLimiter
from gateway.serving.telemetry import GatewayTelemetry, request_timing
from schemas.config import Settings

log = structlog.get_logger("gateway.access")

__all__ = ("OPEN_PATHS", "AccessControl", "AccessMiddleware")

# /info (TEI's model info) is as public as the model list.
OPEN_PATHS: Final = frozenset({"/health", "/ready", "/metrics", "/v1/models", "/models", "/info"})
_OPEN_PREFIXES: Final = ("/schema",)


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

    async def start(self) -> None:
        await self.limiter.start()

    async def stop(self) -> None:
        await self.limiter.stop()

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
            store = KeyStore(fresh.auth.keys)
        except (ConfigError, ValueError, OSError) as exc:  # OSError: config unreadable
            reason = str(exc) if isinstance(exc, ValueError) else f"cannot read the config ({type(exc).__name__})"
            log.error("keys_reload_rejected", error=reason, kept=len(self._settings.auth.keys))
            return False
        old = {k.id for k in self._settings.auth.keys}
        new = {k.id for k in fresh.auth.keys}
        self.keys = store
        self._settings = msgspec.structs.replace(self._settings, auth=fresh.auth)
        ignored = [
            name for name in ("logging", "limits", "cache", "dialects", "models")
            if getattr(fresh, name) != getattr(self._settings, name)
        ]
        for warning in scope_warnings(msgspec.structs.replace(fresh, models=self._settings.models)):
            log.warning("keys_scope_matches_no_model", warning=warning)
        log.info(
            "keys_reloaded", keys=len(new), added=sorted(new - old), removed=sorted(old - new),
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
        if scope["type"] != "http" or _is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        control: AccessControl = Litestar.from_scope(scope).state.access
        access = RequestAccess(key=None, label=ANONYMOUS)
        admission: Admission | None = None
        status: int | None = None  # set when the response starts

        async def send_with_limits(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if admission is not None:
                    headers = MutableScopeHeaders.from_message(message)
                    used = access.usage.tokens if access.usage else 0
                    for name, value in admission.headers(tokens_used=used).items():
                        headers[name] = value
            await send(message)

        with request_access(access), request_timing() as timing:
            try:
                if control.keys.enabled:
                    access.label = UNAUTHENTICATED
                    key = control.keys.authenticate(scope["headers"])
                    access.key, access.label = key, key.id
                    log_fields()["key_id"] = key.id
                    admission = await control.limiter.admit(key)
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
                    await control.limiter.finish(admission, usage.tokens if usage else 0)
                # No status: cancelled before any response, by the client leaving (499) or the
                # server's shutdown (503, answered by gateway.http.middleware).
                control.metrics.record_request(access.label, access.model, status or cancelled_status(scope))
                control.telemetry.observe(timing, model=access.model, route=scope.get("path_template", scope["path"]))
                if usage is not None and access.model is not None:
                    control.metrics.record_usage(
                        access.label,
                        access.model,
                        documents=usage.documents,
                        tokens=usage.tokens,
                        search_units=usage.search_units,
                    )
