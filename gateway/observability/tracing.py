"""OpenTelemetry traces: one span tree per request, exported with OTLP (extra ``otel``).

On when the standard variables ask for it -- ``OTEL_TRACES_EXPORTER`` other than ``none``, or
an ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` -- and
``OTEL_SDK_DISABLED`` is not ``true``. Everything else is the SDK's own reading of the
``OTEL_*`` variables: endpoint, headers, timeout, protocol (``http/protobuf``, the default
here, or ``grpc``), sampler (``OTEL_TRACES_SAMPLER``, parent-based always-on by default),
batching (``OTEL_BSP_*``), resource (``OTEL_SERVICE_NAME``, else ``rerank-gateway``;
``OTEL_RESOURCE_ATTRIBUTES``) and propagators (``OTEL_PROPAGATORS``, W3C trace context and
baggage by default).

Off (the default), nothing of OpenTelemetry is imported and every hook below returns after one
test of a module global: :data:`TRACER` is None. ``docs/benchmarks/tracing-2026-12-04/`` has the
CPU per request off, on, and without this module.

The tree of a rerank request (docs/operating-teams.md)::

    POST /v2/rerank            server span: the W3C parent from traceparent, status, outcome,
    |                          model, documents, tokens, search units
    +- auth                    key lookup, rate limits, quota check
    +- cache.lookup            when the response cache is on (hit or miss)
    +- tokenize                rank texts -> token rows (engines with a tokenizer)
    +- engine                  the engine's work for this request: model, engine, items, tokens
       +- queue                waiting for the engine (its queue_s), when it reports one
       +- engine.step          each step this request joined (rows, tokens): engines reporting their
       |                       steps in the request's own task (static, transformers)
       +- upstream.call        each call to a pool replica or hosted API, traceparent sent on

Attributes never hold a key, a key's hash or any text of a query or document.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

import structlog

import adapters.tracing as adapter_hooks

__all__ = (
    "TRACER",
    "annotate",
    "configure",
    "engine_span",
    "engine_step",
    "serve_request",
    "shutdown",
    "span",
    "wanted",
)

log = structlog.get_logger("gateway.tracing")

TRACER: Any = None  # an OpenTelemetry Tracer once configure() turned tracing on
_provider: Any = None
_NULL: AbstractContextManager[None] = nullcontext()
# The engine span of the current request and when its last step ended (engine_step's parent).
_engine: ContextVar[tuple[Any, int] | None] = ContextVar("rerank_engine_span", default=None)


def wanted(environ: Mapping[str, str]) -> bool:
    """What the standard variables ask for (see the module's docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(environ: Mapping[str, str]) -> bool:
    """Turn tracing on when :func:`wanted`; False (with one warning) when the extra is missing."""
    global TRACER, _provider
    if TRACER is not None or not wanted(environ):
        return TRACER is not None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "tracing_unavailable",
            reason="OTEL_* variables ask for traces but the OpenTelemetry SDK is "
            "not installed: pip install 'rerank-gateway[otel]'",
        )
        return False
    named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "rerank-gateway"}))
    exporters = [e.strip() for e in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if e.strip()]
    for name in exporters:
        exporter = _exporter(name, environ)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    # Not the global provider: a library using the global API must not export into our traces.
    _provider = provider
    TRACER = provider.get_tracer("rerank_gateway")
    adapter_hooks.install(_start_client, _inject, _end_client)
    log.info("tracing_on", exporters=exporters, sampler=environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"))
    del trace
    return True


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("tracing_exporter_unknown", exporter=name, known=["otlp", "console", "none"])
        return None
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            log.warning(
                "tracing_grpc_unavailable",
                reason="OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs "
                "opentelemetry-exporter-otlp-proto-grpc; exporting with http/protobuf instead",
            )
        else:
            return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def shutdown() -> None:
    """Flush what is batched and stop (the app's shutdown); tracing is off afterwards."""
    global TRACER, _provider
    if _provider is not None:
        _provider.shutdown()
    TRACER = _provider = None
    adapter_hooks.install(None, None, None)


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A child span of the current one, made current; a shared no-op when tracing is off."""
    return _NULL if TRACER is None else _span(name, attributes)


@contextmanager
def _span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    assert TRACER is not None
    # Our own outcome instead of the SDK's exception event: its message could quote the input.
    with TRACER.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            _fail(current, exc)
            raise


def annotate(**attributes: Any) -> None:
    """Set attributes on the current span (the request's, where the service calls it)."""
    if TRACER is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes({k: v for k, v in attributes.items() if v is not None})


@contextmanager
def _engine_span(model: str, engine: str, items: int) -> Iterator[Any]:
    assert TRACER is not None
    with TRACER.start_as_current_span(
        "engine",
        attributes={"rerank.model": model, "rerank.engine": engine, "rerank.items": items},
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        token = _engine.set((current, time.time_ns()))
        try:
            yield current
        except BaseException as exc:
            _fail(current, exc)
            raise
        finally:
            _engine.reset(token)


def engine_span(model: str, engine: str, items: int) -> AbstractContextManager[Any]:
    return _NULL if TRACER is None else _engine_span(model, engine, items)


def engine_done(current: Any, *, tokens: int, queue_s: float) -> None:
    """The engine answered: its tokens, and its queue wait as a child span ending where the work began."""
    if current is None or TRACER is None:
        return
    current.set_attributes(
        {"rerank.tokens": tokens, "rerank.queue_ms": round(queue_s * 1e3, 3), "rerank.outcome": "ok"}
    )
    if queue_s > 0:
        from opentelemetry import trace

        start = current.start_time
        queued = TRACER.start_span("queue", context=trace.set_span_in_context(current), start_time=start)
        queued.end(end_time=start + int(queue_s * 1e9))


def engine_step(rows: int, tokens: int) -> None:
    """An engine step this request joined (called by the engine observer in the request's task)."""
    if TRACER is None:
        return
    current = _engine.get()
    if current is None:  # a step run outside a request's task (a shared scheduler): not attributable
        return
    parent, since = current
    from opentelemetry import trace

    now = time.time_ns()
    step = TRACER.start_span(
        "engine.step",
        context=trace.set_span_in_context(parent),
        start_time=since,
        attributes={"rerank.step.rows": rows, "rerank.step.tokens": tokens},
    )
    step.end(end_time=now)
    _engine.set((parent, now))


def _fail(current: Any, exc: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    if isinstance(exc, asyncio.CancelledError):
        current.set_attribute("rerank.outcome", "cancelled")
        return
    current.set_attribute("rerank.outcome", type(exc).__name__)
    current.set_status(Status(StatusCode.ERROR, type(exc).__name__))


async def serve_request(
    scope: dict[str, Any],
    send: Callable[[Any], Awaitable[None]],
    run: Callable[[Callable[[Any], Awaitable[None]]], Awaitable[None]],
) -> None:
    """Run one HTTP request (``run(send)``) under its server span, parented by its traceparent."""
    assert TRACER is not None
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind, Status, StatusCode

    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", ())
        if name in (b"traceparent", b"tracestate", b"baggage")
    }
    parent = propagate.extract(carrier) if carrier else None
    method = scope.get("method", "")
    status = 0

    async def watch(message: Any) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    with TRACER.start_as_current_span(
        f"{method} {scope.get('path', '')}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method, "url.path": scope.get("path", "")},
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            await run(watch)
        finally:
            state = scope.get("state") or {}
            if not status:  # no answer: the client left (499), else the server cancelled it
                status = 499 if state.get("client_disconnected") else 500
            outcome = "ok" if status < 400 else "cancelled" if status == 499 else "refused" if status < 500 else "error"
            current.set_attributes(
                {
                    "http.response.status_code": status,
                    "rerank.outcome": outcome,
                    "rerank.request_id": str(state.get("request_id", "")),
                }
            )
            route = scope.get("path_template")
            if route:
                current.update_name(f"{method} {route}")
            if status >= 500:
                current.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))


# -- the adapters' hooks (adapters.tracing) ----------------------------------------------------
def _start_client(name: str, attributes: dict[str, Any]) -> Any:
    from opentelemetry.trace import SpanKind

    assert TRACER is not None
    return TRACER.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)


def _inject(current: Any, carrier: dict[str, str]) -> None:
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context

    # A context holding the call's span alone: the configured propagators write its trace context
    # (traceparent, tracestate, b3...), and no baggage -- whatever a client sent or code attached
    # (user ids, tenant names) stays here, never reaching a replica or a hosted API.
    propagate.inject(carrier, context=trace.set_span_in_context(current, Context()))


def _end_client(current: Any, outcome: str, attributes: dict[str, Any]) -> None:
    from opentelemetry.trace import Status, StatusCode

    current.set_attributes({"rerank.outcome": outcome, **attributes})
    if outcome not in ("ok", "cancelled"):
        current.set_status(Status(StatusCode.ERROR, outcome))
    current.end()
