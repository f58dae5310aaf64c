"""Request id, timing headers and the one structured log line per request.

The id comes from the client's ``x-request-id`` (sanitized) or is generated; it is returned in
``x-request-id``, used as the response ``id`` and error ``id``, and logged. Handlers add fields
to the log line through :func:`log_fields` (a per-request dict), so the line carries model,
documents and tokens without the middleware knowing about reranking.

A client that disconnects before its answer cancels the request's work: ASGI servers do not
cancel the handler themselves, so once a POST's body is read, a watcher waits for
``http.disconnect`` and cancels the handler task. Cancellation reaches the engine (batches not
yet started never run, vLLM requests are aborted, upstream calls are closed) and the request
is logged and counted with status 499 (nginx's "client closed request").
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from contextvars import ContextVar
from typing import Any

import structlog
from litestar.datastructures import MutableScopeHeaders
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import BodyTimeoutError

__all__ = ("CLIENT_CLOSED", "client_disconnected", "log_fields", "request_context", "request_id")

# nginx's "client closed request": the status logged and counted when the client goes away
# before it has a response. It is never sent (there is nobody to send it to), and it is not a
# 5xx, so error-rate alerts do not fire on client behaviour.
CLIENT_CLOSED = 499

log = structlog.get_logger("gateway.access")

_ID_OK = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
_fields: ContextVar[dict[str, Any] | None] = ContextVar("rerank_log_fields", default=None)


def log_fields() -> dict[str, Any]:
    """The current request's log-line fields (a throwaway dict outside a request)."""
    fields = _fields.get()
    return fields if fields is not None else {}


def request_id(scope: Scope) -> str:
    return str(scope.get("state", {}).get("request_id", ""))


def client_disconnected(scope: Scope) -> bool:
    """The ASGI server told this request that its client went away."""
    return bool(scope.get("state", {}).get("client_disconnected"))


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1").strip()
            return text if _ID_OK.match(text) else None
    return None


async def request_context(
    scope: Scope, receive: Receive, send: Send, next_app: ASGIApp, *, body_timeout_s: float | None = None
) -> None:
    """Run one HTTP request with an id, timing headers and its log line.

    It wraps the whole application (not only matched routes), so 404 and 405 answers get an
    id and a log line too. It notes a client disconnect (logged and counted as 499) and bounds
    the time the whole body may take to arrive (``body_timeout_s``: then 408, see
    ``gateway.servers``), the same under every ASGI server.
    """
    rid = _incoming_id(scope) or uuid.uuid4().hex
    scope.setdefault("state", {})["request_id"] = rid
    fields: dict[str, Any] = {}
    token = _fields.set(fields)
    start = time.perf_counter()
    status = 0  # no response started yet

    body_deadline = None if body_timeout_s is None else time.monotonic() + body_timeout_s
    body_done = False

    async def receive_wrapper() -> Message:
        nonlocal body_done
        if body_done or body_deadline is None:
            message = await receive()
        else:
            try:
                async with asyncio.timeout(max(body_deadline - time.monotonic(), 0.0)):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeoutError(
                    f"the request body did not arrive within {body_timeout_s:g} s; the connection is closed"
                ) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
        if message["type"] == "http.disconnect":
            scope["state"]["client_disconnected"] = True
        return message

    async def send_wrapper(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = MutableScopeHeaders.from_message(message)
            headers["x-request-id"] = rid
            headers["x-process-time-ms"] = f"{(time.perf_counter() - start) * 1e3:.2f}"
        await send(message)

    try:
        if scope.get("method") == "POST":
            if await _run_until_disconnect(scope, receive_wrapper, send_wrapper, next_app):
                status = CLIENT_CLOSED
                fields["disconnected"] = True
        else:  # quick reads: not worth a watcher task
            await next_app(scope, receive_wrapper, send_wrapper)
    finally:
        _fields.reset(token)
        if not status:
            status = CLIENT_CLOSED if client_disconnected(scope) else 500
        log.info(
            "request",
            request_id=rid,
            method=scope.get("method"),
            route=scope.get("path"),
            status=status,
            latency_ms=round((time.perf_counter() - start) * 1e3, 2),
            **fields,
        )


async def _run_until_disconnect(scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> bool:
    """Run the app; cancel it if the client disconnects first. True when it did."""
    body_read = asyncio.Event()
    responded = False

    async def receive_body() -> Message:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_read.set()
        return message

    async def send_tracked(message: Message) -> None:
        nonlocal responded
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            responded = True
        await send(message)

    async def watch() -> None:
        # Only after the app read the whole body is the next message a disconnect (servers
        # answer http.disconnect once the client is gone or the response is complete).
        await body_read.wait()
        while (await receive())["type"] != "http.disconnect":
            pass

    app_task = asyncio.ensure_future(next_app(scope, receive_body, send_tracked))
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({app_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if app_task.done() or responded:
            await app_task
            return False
        app_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await app_task
        return True
    finally:
        watcher.cancel()
        if not app_task.done():  # we were cancelled ourselves (server shutdown timeout)
            app_task.cancel()
