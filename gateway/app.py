"""The single wiring point: ``create_app(settings)`` builds the Litestar application.

Importing this module must not import torch, transformers or vllm (a test enforces it):
engines are built lazily by ``adapters.registry`` when the lifespan starts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeGuard, cast

import structlog
from litestar import Litestar
from litestar.enums import ScopeType
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme
from litestar.types import HTTPScope, LifeSpanReceive, LifeSpanScope, LifeSpanSend, Receive, Scope, Send

from gateway import __version__
from gateway.config.settings import load_settings
from gateway.errors import exception_handlers
from gateway.http.access import AccessControl, AccessMiddleware
from gateway.http.admin import ADMIN_ROUTES
from gateway.http.dialects.openapi import finalize_dialects_openapi
from gateway.http.direct import DirectRoutes
from gateway.http.middleware import request_context
from gateway.http.openapi import finalize_openapi
from gateway.http.routes import ROUTES
from gateway.observability import tracing
from gateway.observability.logging import configure_logging
from gateway.observability.metrics import metrics_endpoint
from gateway.serving import heap
from gateway.serving.cache import build_cache
from gateway.serving.models import ModelRegistry
from gateway.serving.service import RerankService
from schemas.config import Settings

__all__ = ("create_app",)

log = structlog.get_logger("gateway.app")


def _banner(settings: Settings) -> None:
    """One structured line saying what this process serves, where, and how it is guarded."""
    server = settings.server
    host = f"[{server.host}]" if ":" in server.host else server.host
    base = f"http://{host}:{server.port}"
    keys = settings.auth.keys
    log.info(
        "gateway_starting",
        version=__version__,
        address=base,
        runner=server.runner,
        pid=os.getpid(),
        models=[
            {
                "name": m.name,
                "engine": type(m).__struct_config__.tag,
                **({"aliases": list(m.aliases)} if m.aliases else {}),
            }
            for m in settings.models
        ],
        auth=f"api_keys ({len(keys)})" if keys else ("open" if settings.auth.open else "open (loopback only)"),
        metrics=f"{base}/metrics",
        ready=f"{base}/ready",
        log_format=settings.logging.format,
    )


def _operation_id(handler: Any, method: Any, path_components: list[Any]) -> str:
    # Handlers serve several paths (aliases): make each path's id unique and readable.
    path = "_".join(str(getattr(c, "name", c)) for c in path_components) or "root"
    return f"{handler.handler_name}__{path}"


def _is_http(scope: Scope | LifeSpanScope) -> TypeGuard[HTTPScope]:
    return scope["type"] == ScopeType.HTTP  # a str enum: equal to the server's "http"


class GatewayApp(Litestar):
    """Litestar with the request context around everything, routing errors included.

    The rerank POST routes are served by ``gateway.http.direct`` (Litestar's own pieces without its
    per-request router); everything else, and anything those do not match exactly, by Litestar.
    """

    direct = DirectRoutes({})  # set by create_app once the routes are registered
    # Under granian: the timer that cancels requests still running at shutdown_timeout_s
    # (gateway.launch.servers.SigtermDrain); None under uvicorn, which has its own.
    drain: Any = None

    async def __call__(
        self, scope: Scope | LifeSpanScope, receive: Receive | LifeSpanReceive, send: Send | LifeSpanSend
    ) -> None:
        if _is_http(scope):
            # ASGI: an HTTP scope comes with the HTTP receive and send (the lifespan ones never do).
            receive, send = cast(Receive, receive), cast(Send, send)
            timeout = self.state.settings.server.body_read_timeout_s
            next_app = self.direct.match(scope) or super().__call__
            if tracing.TRACER is None:
                handled = request_context(scope, receive, send, next_app, body_timeout_s=timeout)
            else:  # the request's server span around everything, its id and log line included
                handled = tracing.serve_request(
                    cast("dict[str, Any]", scope),  # the scope itself: its state is read after the request
                    send,
                    lambda traced: request_context(scope, receive, traced, next_app, body_timeout_s=timeout),
                )
            await (handled if self.drain is None else self.drain.run(handled))
        else:
            await super().__call__(scope, receive, send)


def _watch_sighup(reload: Any) -> bool:
    """SIGHUP re-reads the API keys; only possible in the main thread's loop (uvicorn's)."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    except (ValueError, RuntimeError, NotImplementedError, AttributeError):
        return False  # tests run the app in a worker thread; Windows has no SIGHUP
    return True


def create_app(
    settings: Settings | None = None,
    *,
    configure_logs: bool = True,
    config_path: str | os.PathLike[str] | None = None,
) -> Litestar:
    """``config_path`` is re-read (with the environment) on SIGHUP to reload ``auth.keys``;
    None: ``$RERANK_CONFIG`` as at start."""
    settings = settings if settings is not None else load_settings()
    if configure_logs:
        configure_logging(settings.logging.level, fmt=settings.logging.format)
    tracing.configure(os.environ)  # OTEL_* variables; off (and nothing imported) without them
    registry = ModelRegistry(settings)
    access = AccessControl(settings)  # API keys, per-key limits, usage metrics
    cache = build_cache(settings)  # None unless [cache] enabled = true
    access.telemetry.attach(registry, cache_enabled=cache is not None)  # latency, load, engine metrics

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        _banner(settings)
        heap.settle("gateway started")  # the app's own long-lived objects, before the models load
        registry.start()
        await access.start()
        hup = _watch_sighup(lambda: access.reload_keys(lambda: load_settings(config_path)))
        try:
            yield
        finally:
            if hup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            # The server has stopped accepting and drained in-flight requests (or timed out).
            started = time.perf_counter()
            log.info("gateway_stopping", models=[rt.name for rt in registry])
            await access.stop()
            await registry.stop()
            if cache is not None:
                await cache.close()
            tracing.shutdown()  # the last spans flushed to the collector
            log.info("gateway_stopped", stop_s=round(time.perf_counter() - started, 2))

    app = GatewayApp(
        route_handlers=[*ROUTES, *ADMIN_ROUTES, metrics_endpoint],
        middleware=[AccessMiddleware],
        lifespan=[lifespan],
        exception_handlers=exception_handlers(),
        request_max_body_size=settings.limits.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="rerank-gateway",
            version=__version__,
            path="/schema",
            operation_id_creator=_operation_id,
            components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
        ),
        logging_config=None,
        debug=False,
    )
    app.state.settings = settings
    app.state.registry = registry
    app.state.access = access
    app.state.usage_metrics = access.metrics
    app.state.service = RerankService(registry, settings.limits, cache=cache)
    app.direct = DirectRoutes.build(app)
    finalize_openapi(app, settings)  # the schemas and error responses the wire really has
    finalize_dialects_openapi(app, settings)  # ... and those of the TEI and vLLM dialects
    return app
