"""Request id, timing headers and the one structured log line per request.

The id comes from the client's ``x-request-id`` (sanitized) or is generated; it is returned in
``x-request-id``, used as the response ``id`` and error ``id``, and logged. Handlers add fields
to the log line through :func:`log_fields` (a per-request dict), so the line carries model,
documents and tokens without the middleware knowing about reranking.
"""

from __future__ import annotations

import re
import time
import uuid
from contextvars import ContextVar
from typing import Any

import structlog
from litestar.datastructures import MutableScopeHeaders
from litestar.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ("log_fields", "request_context", "request_id")

log = structlog.get_logger("gateway.access")

_ID_OK = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
_fields: ContextVar[dict[str, Any] | None] = ContextVar("rerank_log_fields", default=None)


def log_fields() -> dict[str, Any]:
    """The current request's log-line fields (a throwaway dict outside a request)."""
    fields = _fields.get()
    return fields if fields is not None else {}


def request_id(scope: Scope) -> str:
    return str(scope.get("state", {}).get("request_id", ""))


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1").strip()
            return text if _ID_OK.match(text) else None
    return None


async def request_context(scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
    """Run one HTTP request with an id, timing headers and its log line.

    It wraps the whole application (not only matched routes), so 404 and 405 answers get an
    id and a log line too.
    """
    rid = _incoming_id(scope) or uuid.uuid4().hex
    scope.setdefault("state", {})["request_id"] = rid
    fields: dict[str, Any] = {}
    token = _fields.set(fields)
    start = time.perf_counter()
    status = 500

    async def send_wrapper(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = MutableScopeHeaders.from_message(message)
            headers["x-request-id"] = rid
            headers["x-process-time-ms"] = f"{(time.perf_counter() - start) * 1e3:.2f}"
        await send(message)

    try:
        await next_app(scope, receive, send_wrapper)
    finally:
        _fields.reset(token)
        log.info(
            "request",
            request_id=rid,
            method=scope.get("method"),
            route=scope.get("path"),
            status=status,
            latency_ms=round((time.perf_counter() - start) * 1e3, 2),
            **fields,
        )
