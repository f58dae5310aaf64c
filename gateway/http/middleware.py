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

A request the server itself cancels once ``server.shutdown_timeout_s`` is over (uvicorn; under
granian the gateway's own timer, ``gateway.launch.servers.SigtermDrain``) still has its client:
it is answered 503 (:class:`~gateway.errors.ShuttingDownError`) and logged and counted as 503
with ``cancelled="shutdown"``; the cancellation then propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from contextvars import ContextVar
from typing import Any

import msgspec
import structlog
from litestar.types import ASGIApp, HTTPResponseStartEvent, Message, Receive, ReceiveMessage, Scope, Send

from gateway.errors import BodyTimeoutError, ShuttingDownError, classify
from schemas.rerank import ErrorBody

__all__ = (
    "CLIENT_CLOSED",
    "cancelled_status",
    "client_disconnected",
    "log_fields",
    "request_context",
    "request_id",
)

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


def cancelled_status(scope: Scope) -> int:
    """The status of a request cancelled before its response started: 499 when its client left,
    else the server cancelled it (shutdown) and :func:`request_context` answers 503."""
    return CLIENT_CLOSED if client_disconnected(scope) else _SHUTTING_DOWN


_SHUTDOWN_MESSAGE = "the gateway is shutting down and cancelled this request (server.shutdown_timeout_s); retry it"
_SHUTTING_DOWN = classify(ShuttingDownError(_SHUTDOWN_MESSAGE))


async def _answer_shutdown(send: Send, rid: str) -> None:
    message = _SHUTDOWN_MESSAGE
    body = msgspec.json.encode(ErrorBody(message=message, id=rid, detail=message))
    headers = [(name.lower().encode(), value.encode()) for name, value in (ShuttingDownError.headers or {}).items()]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    # The connection may be gone already (uvicorn's ClientDisconnected is an OSError): nobody to tell.
    with contextlib.suppress(OSError, RuntimeError):
        await send({"type": "http.response.start", "status": _SHUTTING_DOWN, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1").strip()
            return text if _ID_OK.match(text) else None
    return None


def _new_id() -> str:
    """A random version-4 UUID in hex, as ``uuid.uuid4().hex`` gives, without building a UUID
    object (a third of the cost of the whole id handling per request)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    return raw.hex()


def _with_headers(message: HTTPResponseStartEvent, added: list[tuple[bytes, bytes]]) -> None:
    """Set response headers (replacing any of the same name) on an ``http.response.start``.

    Names are lower-case bytes. The same result as Litestar's ``MutableScopeHeaders``
    assignment, for a list copy instead of a header object per header set.
    """
    names = {name for name, _ in added}
    message["headers"] = [h for h in message.get("headers") or () if h[0].lower() not in names] + added


async def request_context(
    scope: Scope, receive: Receive, send: Send, next_app: ASGIApp, *, body_timeout_s: float | None = None
) -> None:
    """Run one HTTP request with an id, timing headers and its log line.

    It wraps the whole application (not only matched routes), so 404 and 405 answers get an
    id and a log line too. It notes a client disconnect (logged and counted as 499) and bounds
    the time the whole body may take to arrive (``body_timeout_s``: then 408, see
    ``gateway.launch.servers``), the same under every ASGI server.
    """
    rid = _incoming_id(scope) or _new_id()
    state = scope.setdefault("state", {})
    state["request_id"] = rid
    fields: dict[str, Any] = {}
    token = _fields.set(fields)
    start = time.perf_counter()
    status = 0  # no response started yet

    body_deadline = None if body_timeout_s is None else time.monotonic() + body_timeout_s
    body_done = False
    # POSTs get a disconnect watcher once their body is read (see _DisconnectWatch); quick
    # reads are not worth one.
    watch = _DisconnectWatch(receive, state) if scope.get("method") == "POST" else None

    async def receive_wrapper() -> ReceiveMessage:
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
        if not body_done:
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            if body_done and watch is not None:
                watch.start()
        if message["type"] == "http.disconnect":
            state["client_disconnected"] = True
        return message

    async def send_wrapper(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            _with_headers(
                message,
                [
                    (b"x-request-id", rid.encode("latin-1")),
                    (b"x-process-time-ms", f"{(time.perf_counter() - start) * 1e3:.2f}".encode()),
                ],
            )
        elif watch is not None and message["type"] == "http.response.body" and not message.get("more_body", False):
            watch.responded = True  # a disconnect from now on is the normal end of the exchange
        await send(message)

    try:
        if watch is None:
            await next_app(scope, receive_wrapper, send_wrapper)
        elif await watch.run(next_app(scope, receive_wrapper, send_wrapper)):
            status = CLIENT_CLOSED
            fields["disconnected"] = True
    except asyncio.CancelledError:
        if not client_disconnected(scope):
            # The server's cancellation (shutdown timeout), not the client's doing and no bug:
            # the client still waits, so tell it to retry; the server's own answer is a bare 500.
            fields["cancelled"] = "shutdown"
            if not status:
                await _answer_shutdown(send_wrapper, rid)
                status = status or _SHUTTING_DOWN  # as counted in /metrics (gateway.http.access)
        raise
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


class _DisconnectWatch:
    """Cancel a request's work when its client disconnects before the response is complete.

    The app runs in the request's own task. Once the app has read the whole body, the next
    message the server has for this request is ``http.disconnect`` (servers send it when the
    client is gone, or once the response is complete), so one watcher task started then waits
    for it and cancels the request's task if the response is not complete yet. A POST costs
    one extra task, started only after its body arrived (a request refused before reading its
    body, or one whose body never arrives, has none: the body timeout covers that).
    """

    __slots__ = ("_receive", "_state", "_task", "_watcher", "cancelled", "responded")

    def __init__(self, receive: Receive, state: dict[str, Any]) -> None:
        self._receive = receive
        self._state = state
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.cancelled = False  # the watcher cancelled the request's task
        self.responded = False  # the last body message was handed to the server

    def start(self) -> None:
        if self._watcher is None and self._task is not None:
            self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._state["client_disconnected"] = True
        if not self.responded and self._task is not None:
            self.cancelled = True
            self._task.cancel()

    async def run(self, app: Any) -> bool:
        """Await the app's coroutine; True when the client left first and the app was cancelled."""
        self._task = asyncio.current_task()
        if self._task is None:  # driven outside any task (no server we run does this): nothing to cancel
            await app
            return False
        try:
            await app
        except asyncio.CancelledError:
            # Ours alone (uncancel() drops it to 0): the client left. Another cancellation
            # too (server shutdown): let it propagate.
            if not self.cancelled or self._task.uncancel() > 0:
                raise
            return True
        else:
            if self.cancelled:  # the app swallowed our cancellation: clear it, the client is gone all the same
                self._task.uncancel()
            return self.cancelled
        finally:
            if self._watcher is not None:
                self._watcher.cancel()
