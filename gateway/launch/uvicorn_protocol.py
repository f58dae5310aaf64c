"""uvicorn's httptools protocol with the two connection bounds it lacks.

uvicorn arms its keep-alive timer only after a response and has no header-read deadline, so a
client could hold a fresh connection, or one trickling its headers or an unread body, forever.
``TimedHttpToolsProtocol`` arms the idle timer at connect, closes a connection whose headers
are not complete within ``server.header_read_timeout_s`` of their first byte, and one whose body
is still arriving ``server.body_read_timeout_s`` after its headers. :func:`timed_protocol` is
what :func:`gateway.launch.servers.run_uvicorn` passes as ``http=``. Apart from the runners because
it is a subclass of uvicorn's internals, built lazily (uvicorn is imported only when it serves)
and looked up by this module's name in spawned workers.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ("timed_protocol",)


def timed_protocol(header_timeout_s: float | None, body_timeout_s: float | None = None) -> Any:
    """uvicorn's httptools protocol with a header-read deadline and an idle timer from connect.

    ``None``: the class reads the deadline from this process's settings (worker processes of
    ``server.workers > 1`` are spawned and import the class by name: it must be module-level).
    """
    base = _module_protocol()
    if header_timeout_s is None:
        return base
    return type(
        "TimedHttpToolsProtocol", (base,), {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s}
    )


_PROTOCOL: Any = None


def _module_protocol() -> Any:
    global _PROTOCOL
    if _PROTOCOL is None:
        _PROTOCOL = _build_protocol()
    return _PROTOCOL


def _build_protocol() -> Any:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class TimedHttpToolsProtocol(HttpToolsProtocol):
        header_timeout_s: float | None = None
        body_timeout_s: float | None = None
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _awaiting_headers = True

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # A client that connects and sends nothing is idle: uvicorn arms its keep-alive
            # timer only after a response, so arm it now.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def data_received(self, data: bytes) -> None:
            if self._awaiting_headers and self._header_timer is None:
                self._header_timer = self.loop.call_later(_header_timeout(self), self._header_timeout)
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._cancel_header_timer()
            self._awaiting_headers = False
            super().on_headers_complete()
            # The body must be complete by then; one the app does not read (it answered without
            # it) would otherwise hold the connection as long as its bytes keep trickling in.
            self._cancel_body_timer()
            self._body_timer = self.loop.call_later(_body_timeout(self), self._body_timeout)

        def on_message_complete(self) -> None:
            self._awaiting_headers = True  # the next bytes start the next request's headers
            self._cancel_body_timer()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            self._cancel_body_timer()
            super().connection_lost(exc)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _cancel_body_timer(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _body_timeout(self) -> None:
            self._body_timer = None
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                if not self.transport.is_closing():
                    self.transport.close()
            else:
                cycle.keep_alive = False  # still answering (the app's 408 if it reads): close after it

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    # Spawned workers unpickle the class by this module's name.
    TimedHttpToolsProtocol.__qualname__ = "TimedHttpToolsProtocol"
    return TimedHttpToolsProtocol


def _header_timeout(protocol: Any) -> float:
    if protocol.header_timeout_s is None:  # a worker process: its settings (same env as the parent)
        from gateway.config.settings import load_settings

        type(protocol).header_timeout_s = load_settings().server.header_read_timeout_s
    return float(protocol.header_timeout_s)


def _body_timeout(protocol: Any) -> float:
    if protocol.body_timeout_s is None:  # a worker process: its settings (same env as the parent)
        from gateway.config.settings import load_settings

        type(protocol).body_timeout_s = load_settings().server.body_read_timeout_s
    return float(protocol.body_timeout_s)


def __getattr__(name: str) -> Any:
    # `gateway.launch.uvicorn_protocol.TimedHttpToolsProtocol`, as pickled for spawned uvicorn workers.
    if name == "TimedHttpToolsProtocol":
        return _module_protocol()
    raise AttributeError(name)
