"""The request context in-process: the disconnect watcher's cancellation, the response headers,
the request id, and the bracket bound in front of the depth check.

The ASGI server is played by two coroutines: ``receive`` hands out the body, then (like uvicorn)
holds the next call until the client goes away or the response is complete and answers
``http.disconnect``. No sockets, no timed assertions: events order everything.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from gateway.errors import MalformedRequestError
from gateway.http import middleware
from gateway.http.decoding import MAX_JSON_DEPTH, _few_brackets, check_depth
from gateway.http.middleware import CLIENT_CLOSED, _new_id, log_fields, request_context


class FakeServer:
    """One request's receive/send as an ASGI server gives them."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()  # the client disconnected, or the response is complete
        self.sent: list[dict[str, Any]] = []
        self._body_given = False

    async def receive(self) -> dict[str, Any]:
        if not self._body_given:
            self._body_given = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.gone.set()  # uvicorn: a complete response makes receive() answer disconnect


def _scope(method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": "/v2/rerank", "headers": [], "state": {}}


async def _respond(send: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": headers or []})
    await send({"type": "http.response.body", "body": b"{}"})


class LogRecorder:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append({"event": event, **fields})


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    recorder = LogRecorder()
    monkeypatch.setattr(middleware, "log", recorder)
    return recorder.lines


def test_disconnect_while_the_app_works_cancels_it_in_its_own_task_and_logs_499(logged):
    async def main() -> tuple[bool, int, Any]:
        server = FakeServer()
        started = asyncio.Event()
        cancelled = False

        async def app(scope: Any, receive: Any, send: Any) -> None:
            nonlocal cancelled
            await receive()  # the whole body: the watcher starts now
            log_fields()["model"] = "m"
            started.set()
            try:
                await asyncio.sleep(3600)  # engine work
            except asyncio.CancelledError:
                cancelled = True
                raise
            await _respond(send)

        task = asyncio.ensure_future(request_context(_scope(), server.receive, server.send, app, body_timeout_s=5.0))
        await started.wait()
        server.gone.set()  # the client goes away
        # Returns normally (the watcher's cancellation is not the caller's); bounded so that a
        # watcher that never fires fails the test instead of hanging it.
        await asyncio.wait_for(task, 60)
        return cancelled, task.cancelling(), server.sent

    cancelled, cancelling, sent = asyncio.run(main())
    assert cancelled and cancelling == 0 and sent == []
    assert len(logged) == 1
    assert logged[0]["status"] == CLIENT_CLOSED and logged[0]["disconnected"] is True and logged[0]["model"] == "m"


def test_the_disconnect_that_follows_a_complete_response_cancels_nothing(logged):
    async def main() -> tuple[int, list[dict[str, Any]]]:
        server = FakeServer()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await _respond(send, [(b"content-type", b"application/json"), (b"X-Request-Id", b"the-app's")])
            # The server now answers disconnect (response complete); the app still runs a bit.
            for _ in range(5):
                await asyncio.sleep(0)

        task = asyncio.ensure_future(request_context(_scope(), server.receive, server.send, app))
        await task
        return task.cancelling(), server.sent

    cancelling, sent = asyncio.run(main())
    assert cancelling == 0
    headers = sent[0]["headers"]
    names = [name.lower() for name, _ in headers]
    assert names.count(b"x-request-id") == 1 and b"x-process-time-ms" in names and b"content-type" in names
    assert len(logged) == 1 and logged[0]["status"] == 200 and "disconnected" not in logged[0]


@pytest.mark.parametrize("client_gone_too", [False, True], ids=["server-cancel", "disconnect-then-server-cancel"])
def test_a_server_cancellation_propagates_with_or_without_a_disconnect(logged, client_gone_too):
    """The server's cancellation (its shutdown timeout) is never swallowed, not even when the
    client's disconnect has already made the watcher cancel the request's task."""

    async def main() -> bool:
        server = FakeServer()
        started = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.ensure_future(request_context(_scope(), server.receive, server.send, app))
        await started.wait()
        if client_gone_too:
            server.gone.set()
            await asyncio.sleep(0)  # the watcher sees the disconnect and cancels the request's task
        task.cancel()  # server shutdown timeout
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(main()), "the server's cancellation was swallowed"


def test_a_request_that_never_reads_its_body_gets_no_watcher(logged):
    async def main() -> int:
        server = FakeServer()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await _respond(send)  # e.g. 401 before the body is read

        before = len(asyncio.all_tasks())
        await request_context(_scope(), server.receive, server.send, app)
        return len(asyncio.all_tasks()) - before

    assert asyncio.run(main()) == 0


def test_generated_request_ids_are_uuid4_hex():
    ids = {_new_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", i) for i in ids)


def test_the_bracket_bound_counts_every_opening_bracket():
    assert _few_brackets(b'{"documents": ["a", "b"]}', MAX_JSON_DEPTH)
    assert _few_brackets(b"[" * 40 + b"{" * 24, 64)
    assert not _few_brackets(b"[" * 40 + b"{" * 25, 64)
    assert not _few_brackets(b'{"a": "x"}' * 65, 64)
    # Past the bound the full check runs: brackets spread through a long body still count.
    deep = (
        b'{"x": '
        + b'"'
        + b"y" * 50_000
        + b'", "d": '
        + b"[" * (MAX_JSON_DEPTH + 1)
        + b"]" * (MAX_JSON_DEPTH + 1)
        + b"}"
    )
    with pytest.raises(MalformedRequestError, match="nested too deeply"):
        check_depth(deep)
    check_depth(b'{"x": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}")
