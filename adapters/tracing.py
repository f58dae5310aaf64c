"""Trace hooks for the adapters: client spans around upstream calls and the W3C trace context
(``traceparent`` / ``tracestate``) on their requests.

The adapters never import OpenTelemetry (an optional extra): these functions do nothing until
``gateway.observability.tracing`` installs the real ones, which it does only when tracing is on.
Off, an upstream call pays three calls that each test one module global.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ("end", "headers", "install", "start")

# Set by gateway.observability.tracing.configure(); None: tracing is off.
_start: Callable[[str, dict[str, Any]], Any] | None = None
_headers: Callable[[Any, dict[str, str]], None] | None = None
_end: Callable[[Any, str, dict[str, Any]], None] | None = None


def install(
    start_fn: Callable[[str, dict[str, Any]], Any] | None,
    headers_fn: Callable[[Any, dict[str, str]], None] | None,
    end_fn: Callable[[Any, str, dict[str, Any]], None] | None,
) -> None:
    global _start, _headers, _end
    _start, _headers, _end = start_fn, headers_fn, end_fn


def start(name: str, attributes: dict[str, Any]) -> Any:
    """A client span, child of the current one (not made current); None when tracing is off.

    ``attributes`` never hold a key or document text: model, target (the upstream's name or
    replica address without credentials), sizes.
    """
    return None if _start is None else _start(name, attributes)


def headers(span: Any, base: dict[str, str] | None = None) -> dict[str, str] | None:
    """``base`` plus ``traceparent`` / ``tracestate`` naming ``span`` as the caller; ``base``
    itself (maybe None) when tracing is off."""
    if span is None or _headers is None:
        return base
    out = dict(base or {})
    _headers(span, out)
    return out


def end(span: Any, outcome: str, **attributes: Any) -> None:
    """End ``span``: outcome "ok", "cancelled", or what failed (an HTTP status, an error class)."""
    if span is not None and _end is not None:
        _end(span, outcome, attributes)
