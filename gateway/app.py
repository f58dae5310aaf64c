"""The single wiring point: ``create_app(settings)`` builds the Litestar application.

Importing this module must not import torch, transformers or vllm (a test enforces it):
engines are built lazily by ``adapters.registry`` when the lifespan starts.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from litestar import Litestar
from litestar.types import Receive, Scope, Send
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from gateway import __version__
from gateway.access import AccessControl, AccessMiddleware
from gateway.cache import build_cache
from gateway.errors import exception_handlers
from gateway.logging import configure_logging
from gateway.metrics import metrics_endpoint
from gateway.middleware import request_context
from gateway.models import ModelRegistry
from gateway.routes import ROUTES
from gateway.service import RerankService
from gateway.settings import load_settings
from schemas.config import Settings

__all__ = ("create_app",)


def _operation_id(handler: Any, method: Any, path_components: list[Any]) -> str:
    # Handlers serve several paths (aliases): make each path's id unique and readable.
    path = "_".join(str(getattr(c, "name", c)) for c in path_components) or "root"
    return f"{handler.handler_name}__{path}"


class GatewayApp(Litestar):
    """Litestar with the request context around everything, routing errors included."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await request_context(scope, receive, send, super().__call__)
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
    registry = ModelRegistry(settings)
    access = AccessControl(settings)  # API keys, per-key limits, usage metrics
    cache = build_cache(settings)  # None unless [cache] enabled = true
    access.telemetry.attach(registry, cache_enabled=cache is not None)  # latency, load, engine metrics

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        registry.start()
        await access.start()
        hup = _watch_sighup(lambda: access.reload_keys(lambda: load_settings(config_path)))
        try:
            yield
        finally:
            if hup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            await access.stop()
            await registry.stop()
            if cache is not None:
                await cache.close()

    app = GatewayApp(
        route_handlers=[*ROUTES, metrics_endpoint],
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
    return app
