"""Direct routes: the rerank POST routes served straight from ASGI, skipping Litestar's
per-request routing machinery but running the same pieces in the same order.

Why: on the passthrough path (``pool`` engine in front of a fast upstream) the gateway's own
CPU is the added latency. Litestar's router, its kwargs and signature models, the
``Response`` -> ``ASGIResponse`` objects and their generic paths cost 0.15 M of the 2.24 M
instructions (valgrind) of a whole 100-document passthrough request, and 17 % of its CPU at 32
clients (docs/benchmarks/cpu-2026-12-01-direct/). None of that work is needed for a route that
takes exactly ``(request, data)`` with ``data`` decoded by our
:class:`~gateway.http.decoding.StrictBody`.

What a direct route does is what Litestar does for it, with Litestar's own objects:

- the router's scope fields (``app``, ``litestar_app``, ``route_handler``, ``path_template``,
  ``path_params``) and its Host header check (a stricter subset; anything else falls through);
- the route's middleware (``AccessMiddleware``) built as ``build_route_middleware_stack`` does,
  between two exception layers as Litestar puts them (app-level outside, route-level inside),
  both answering with the route handler's resolved exception handlers;
- the handler's request class and ``Request.body()`` (size limit -> 413, disconnect -> 499),
  the route's DTO ``decode_bytes``, the handler function;
- the answer: a plain ``Response`` of JSON content (every success of these routes) is written
  as ``Response.to_asgi_response`` would write it -- the same serializer (the handler's type
  encoders), the response's headers lower-cased in order, then ``content-type`` and
  ``content-length`` -- without building the intermediate objects; anything else (cookies,
  background tasks, another media type or response class) goes through
  ``handler.to_response``.

What stays with Litestar: every other route (GETs, ``/schema``, ``/metrics``), every request
not matched exactly (a trailing slash, a ``root_path``, an unusual Host header, another
method: 404/405 come from Litestar), and the whole app as soon as it is configured with
something a direct route would not reproduce (CORS, compression, CSRF, allowed hosts,
``before_send``/``after_exception`` hooks, Litestar logging, response caching, OpenTelemetry):
then :meth:`DirectRoutes.build` returns an empty table. ``tests/test_direct_routes.py`` sends
the same requests both ways and requires the same bytes.
"""

from __future__ import annotations

import re
from inspect import getmro
from typing import Any, Final

import msgspec
from litestar import Litestar, Response
from litestar.enums import MediaType
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute
from litestar.serialization import get_serializer
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.decoding import StrictBody

__all__ = ("DirectRoutes",)

# Host values served directly: names, IPv4, [IPv6], ports. Litestar's router accepts a wider
# set (RFC 3986 reg-name characters) and refuses the rest with 400; anything outside this
# subset falls through to it, so both its answer and its acceptance stay Litestar's.
_PLAIN_HOST: Final = re.compile(rb"\A[0-9A-Za-z.\-:\[\]]*\Z")


def _app_is_plain(app: Litestar) -> bool:
    """Nothing configured on the app that wraps routes or sends in ways a direct route skips."""
    if "OpenTelemetryPlugin" in {type(p).__name__ for p in app.plugins}:
        return False
    return not (
        app.before_send
        or app.after_exception
        or app.cors_config
        or app.compression_config
        or app.csrf_config
        or app.allowed_hosts
        or app.logging_config
        or app.pdb_on_exception
    )


def _eligible(route: HTTPRoute, handler: HTTPRouteHandler) -> bool:
    dto = handler.resolve_data_dto()
    handlers = handler.resolve_exception_handlers()
    return (
        set(handler.http_methods) == {"POST"}
        and not route.path_parameters
        and dto is not None
        and issubclass(dto, StrictBody)
        and handler.resolve_return_dto() is None
        and list(handler.parsed_fn_signature.parameters) == ["request", "data"]
        and not handler.has_sync_callable
        and not handler.cache
        and not handler.resolve_guards()
        and not handler.resolve_dependencies()
        and handler.resolve_before_request() is None
        and handler.resolve_after_response() is None
        # Every exception must have a handler here: a direct route cannot hand one back.
        and Exception in handlers
    )


class _Route:
    """One path's direct ASGI app."""

    __slots__ = (
        "app",
        "dto",
        "encoder",
        "exception_handlers",
        "fn",
        "handler",
        "lean",
        "path",
        "request_class",
        "stack",
        "type_encoders",
    )

    def __init__(self, app: Litestar, handler: HTTPRouteHandler, path: str) -> None:
        self.app = app
        self.handler = handler
        self.path = path
        self.fn = handler.fn
        self.dto = handler.resolve_data_dto()
        self.request_class = handler.resolve_request_class()
        self.exception_handlers = handler.resolve_exception_handlers()
        self.type_encoders = handler.resolve_type_encoders()
        # Litestar's own serializer for this handler (msgspec + the handler's type encoders),
        # in a reusable encoder: the same bytes as Response.render gives.
        self.encoder = msgspec.json.Encoder(enc_hook=get_serializer(self.type_encoders))
        # Nothing at the handler's layers that to_response would add to a Response.
        self.lean = (
            not handler.resolve_response_headers()
            and not handler.resolve_response_cookies()
            and handler.background is None
            and not any(layer.after_request for layer in handler.ownership_layers)
            and handler.media_type in ("", MediaType.JSON, MediaType.JSON.value)  # "": the default, JSON
            and handler.status_code >= 200
            and handler.status_code not in (204, 304)  # a status without a body
        )
        inner: ASGIApp = self._inner_guard
        for middleware in handler.resolve_middleware():  # as build_route_middleware_stack does
            # Litestar's middleware union (a factory, a (factory, kwargs) pair, a DefineMiddleware)
            # is told apart by shape there too, which no static type expresses.
            layer: Any = middleware
            if hasattr(layer, "__iter__"):
                factory, kwargs = layer
                inner = factory(app=inner, **kwargs)
            else:
                inner = layer(app=inner)
        self.stack = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # What Litestar.__call__ and its router set before calling the route.
        scope["app"] = scope["litestar_app"] = self.app
        scope.setdefault("path_params", {})
        scope["route_handler"] = self.handler
        scope["path_template"] = self.path
        await self._guard(self.stack, scope, receive, send)

    async def _inner_guard(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._guard(self._serve, scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = self.request_class(scope=scope, receive=receive, send=send)
        body = await request.body()  # Litestar's size limit (413) and disconnect handling
        # An empty body reaches decode_bytes too: decode_json answers it with the same 400
        # that gateway.errors gives Litestar's "missing data" for it.
        data = self.dto(request).decode_bytes(body)  # type: ignore[misc]
        response = await self.fn(request, data)
        if self.lean and _plain_json(response):
            await self._send_json(response, send)
            return
        asgi_response = await self.handler.to_response(app=self.app, data=response, request=request)
        await asgi_response(scope, receive, send)

    async def _send_json(self, response: Response[Any], send: Send) -> None:
        """What ``to_asgi_response(...)`` and ``ASGIResponse.__call__`` send for ``response``."""
        body = self.encoder.encode(response.content)
        headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in response.headers.items()
        ]
        names = {name for name, _ in headers}
        if b"content-type" not in names:
            headers.append((b"content-type", b"application/json"))
        if b"content-length" not in names:
            headers.append((b"content-length", str(len(body)).encode("latin-1")))
        status = response.status_code or self.handler.status_code
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _guard(self, next_app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Litestar's ExceptionHandlerMiddleware for this route: an exception before the
        response started is answered by the route's handler for it, through ``send``."""
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await next_app(scope, receive, watch)
        except Exception as exc:
            if started:
                raise  # nothing can be answered any more; the server closes the connection
            request = self.request_class(scope=scope, receive=receive, send=send)
            response = self._exception_handler(exc)(request, exc)
            await response.to_asgi_response(app=None, request=request, type_encoders=self.type_encoders)(
                scope, receive, send
            )

    def _exception_handler(self, exc: Exception) -> Any:
        # Litestar's lookup: an HTTPException's status code first, then the exception's MRO.
        handlers = self.exception_handlers
        if isinstance(exc, HTTPException) and (by_status := handlers.get(exc.status_code)):
            return by_status
        return next(handlers[cls] for cls in getmro(type(exc)) if cls in handlers)


def _plain_json(response: Any) -> bool:
    """A Response that to_asgi_response turns into JSON headers + body and nothing else."""
    return (
        type(response) is Response
        and not response.cookies
        and response.background is None
        and not response.response_type_encoders
        and response.media_type in (None, "", MediaType.JSON, MediaType.JSON.value)
        and not isinstance(response.content, (bytes, str))
        and (response.status_code or 200) >= 200
        and response.status_code not in (204, 304)
    )


class DirectRoutes:
    """The table of direct routes of one app, by exact path."""

    __slots__ = ("_routes",)

    def __init__(self, routes: dict[str, _Route]) -> None:
        self._routes = routes

    @classmethod
    def build(cls, app: Litestar) -> DirectRoutes:
        routes: dict[str, _Route] = {}
        if _app_is_plain(app):
            for route in app.routes:
                if not isinstance(route, HTTPRoute):
                    continue
                for handler in route.route_handlers:
                    if _eligible(route, handler):
                        routes[route.path] = _Route(app, handler, route.path)
        return cls(routes)

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(self._routes)

    @property
    def lean_paths(self) -> frozenset[str]:
        """Paths whose plain JSON answers are written without Litestar's response objects."""
        return frozenset(path for path, route in self._routes.items() if route.lean)

    def match(self, scope: Scope) -> ASGIApp | None:
        """The direct app for this HTTP request, or None: Litestar serves it."""
        route = self._routes.get(scope["path"])
        if route is None or scope.get("method") != "POST" or scope.get("root_path"):
            return None
        for name, value in scope["headers"]:
            if name == b"host" and not _PLAIN_HOST.match(value):
                return None
        return route
