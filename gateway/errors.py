"""One exception family, one table from exception to status, one handler writing the body.

Every error response -- ours, the engines', and Litestar's own 404/405/413 -- carries the
Cohere error body ``{"message", "id"}`` plus ``"detail"`` (Jina-style clients raise
``RuntimeError(resp["detail"])``). 5xx bodies never contain exception text or a traceback;
the log line does.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException, InternalServerException, ValidationException

from adapters.base import (
    EngineAccountError,
    EngineError,
    EngineInputError,
    EngineMisconfiguredError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from schemas.rerank import ErrorBody

__all__ = (
    "ERROR_TABLE",
    "AdminOnlyError",
    "AdminUnavailableError",
    "AuthError",
    "BodyTimeoutError",
    "ForbiddenModelError",
    "GatewayError",
    "InputTooLongError",
    "InvalidRequestError",
    "KeyConflictError",
    "KeyNotFoundError",
    "KeyStoreUnavailableError",
    "MalformedRequestError",
    "ModelUnavailableError",
    "PayloadTooLargeError",
    "RateLimitStoreError",
    "RateLimitedError",
    "RawScoresUnsupportedError",
    "ShuttingDownError",
    "UnknownModelError",
    "UnsupportedByEngineError",
    "describe_error",
    "error_response",
    "exception_handlers",
)

log = structlog.get_logger("gateway.errors")


class GatewayError(Exception):
    """Base of the gateway's own errors; the message is safe to show to the client."""

    # Read-only at class level (a subclass's shared headers must not be changed through one
    # instance); an instance sets its own mapping.
    headers: Mapping[str, str] | None = None


class MalformedRequestError(GatewayError):
    """The body is not JSON (400)."""


class InvalidRequestError(GatewayError):
    """The body is JSON but not a valid rerank request (422)."""


class UnsupportedByEngineError(InvalidRequestError):
    """The request is valid, but this model's engine cannot do what it asks (422): another engine
    could (a chain moves on to its next target; gateway.serving.routing.chain)."""


class RawScoresUnsupportedError(UnsupportedByEngineError):
    """Raw scores were asked for (TEI ``raw_scores``, vLLM ``use_activation: false``) but the
    model's engine only outputs scores in [0, 1] (422; the TEI dialect answers TEI's 424)."""


class UnknownModelError(GatewayError):
    """No configured model has this name (404)."""


class PayloadTooLargeError(GatewayError):
    """Body, document count or chunk count over the configured limit (413)."""


class InputTooLongError(PayloadTooLargeError):
    """A text does not fit the model's window and the request forbids truncating it (413)."""


class ModelUnavailableError(GatewayError):
    """The model is loading, failed to load or is unhealthy (503)."""

    def __init__(self, message: str, *, retry_after: int = 10) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after)}


class AuthError(GatewayError):
    """No API key, or an unknown or expired one (401). The message never quotes the key."""

    headers: Mapping[str, str] | None = MappingProxyType({"WWW-Authenticate": 'Bearer realm="rerank-gateway"'})


class ForbiddenModelError(GatewayError):
    """The API key is valid but not allowed to use this model (403)."""


class AdminOnlyError(GatewayError):
    """The admin API (``/admin/``) was called with a key that is not an admin key (403)."""


class KeyNotFoundError(GatewayError):
    """The admin API names a key id that does not exist (404)."""


class KeyConflictError(GatewayError):
    """The admin API cannot make this change: the id exists, or the key file owns it (409)."""


class AdminUnavailableError(GatewayError):
    """The admin API needs the shared key store, ``limits.redis_url``, and none is set (501)."""


class KeyStoreUnavailableError(GatewayError):
    """The shared key store (Redis, ``limits.redis_url``) failed or timed out during an admin call (503)."""

    headers: Mapping[str, str] | None = MappingProxyType({"Retry-After": "5"})


class RateLimitedError(GatewayError):
    """The API key is over one of its limits (429); headers carry Retry-After and X-RateLimit-*."""

    def __init__(self, message: str, *, headers: dict[str, str], limit: str) -> None:
        super().__init__(message)
        self.headers = headers
        self.limit = limit  # "rpm", "tpm" or "max_concurrent": a metrics label


class RateLimitStoreError(GatewayError):
    """The shared rate-limit store (Redis) is unreachable and limits.redis_failure is "closed" (503)."""

    headers: Mapping[str, str] | None = MappingProxyType({"Retry-After": "5"})


class BodyTimeoutError(GatewayError):
    """The body did not arrive within server.body_read_timeout_s (408); the connection is closed."""

    headers: Mapping[str, str] | None = MappingProxyType({"Connection": "close"})


class ShuttingDownError(GatewayError):
    """The server's shutdown cancelled the request after server.shutdown_timeout_s (503); the
    client is still there and is told to retry (the SDKs retry 503), elsewhere or later."""

    headers: Mapping[str, str] | None = MappingProxyType({"Retry-After": "5", "Connection": "close"})


# Most specific class first is not required: lookup walks the exception's MRO.
ERROR_TABLE: Final[dict[type[Exception], int]] = {
    MalformedRequestError: 400,
    InvalidRequestError: 422,
    UnknownModelError: 404,
    PayloadTooLargeError: 413,
    ModelUnavailableError: 503,
    AuthError: 401,
    ForbiddenModelError: 403,
    RateLimitedError: 429,
    AdminOnlyError: 403,
    KeyNotFoundError: 404,
    KeyConflictError: 409,
    AdminUnavailableError: 501,
    KeyStoreUnavailableError: 503,
    RateLimitStoreError: 503,
    EngineInputError: 422,
    EngineUnavailableError: 503,
    EngineTimeoutError: 504,
    EngineMisconfiguredError: 502,
    EngineAccountError: 502,
    EngineError: 502,
    ValidationException: 422,  # the body decoded but does not fit the request schema
    BodyTimeoutError: 408,
    ShuttingDownError: 503,
}

# Messages for statuses whose exception text must not reach the client.
_SAFE_MESSAGES: Final[dict[int, str]] = {
    500: "internal server error",
    502: "the model's engine failed to score this request",
    504: "the model's engine did not answer in time",
}


def classify(exc: Exception) -> int:
    if _is_disconnect(exc):
        return 499  # gateway.http.middleware.CLIENT_CLOSED: logged and counted, never sent
    if isinstance(exc, ValidationException) and _is_empty_body(exc):
        return 400
    for cls in type(exc).__mro__:
        status = ERROR_TABLE.get(cls)
        if status is not None:
            return status
    if isinstance(exc, HTTPException):
        return exc.status_code
    return 500


def _is_disconnect(exc: Exception) -> bool:
    # Litestar reports a client that disconnected while it read the body (mid-body hang-up,
    # or chunked framing the server rejected) as this 500; it is the client's doing.
    return isinstance(exc, InternalServerException) and exc.detail == "client disconnected prematurely"


def _message(exc: Exception, status: int) -> str:
    if status == 499:
        return "the client disconnected before the request was answered"
    if isinstance(exc, ValidationException):
        if _is_empty_body(exc):
            return "the request body is empty; send a JSON object"
        return "invalid request: " + "; ".join(_validation_messages(exc))
    if isinstance(exc, HTTPException):
        # Litestar's own client errors (404 route, 405, 413 body, malformed JSON) are safe.
        if status == 400 and "malformed" not in exc.detail.lower():
            return f"JSON is malformed: {exc.detail}"
        return exc.detail if status < 500 else _SAFE_MESSAGES.get(status, "server error")
    if isinstance(exc, EngineUnavailableError | GatewayError | EngineInputError | EngineMisconfiguredError):
        return str(exc)
    if status in _SAFE_MESSAGES:
        return _SAFE_MESSAGES[status]
    return str(exc) if status < 500 else "server error"


def _is_empty_body(exc: ValidationException) -> bool:
    # Litestar reports a missing body as a missing `data` argument.
    extra = exc.extra if isinstance(exc.extra, list) else []
    return any(isinstance(i, dict) and i.get("key") == "data" and i.get("message") == "'data'" for i in extra)


def _validation_messages(exc: ValidationException) -> list[str]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    out = []
    for item in extra:
        if not isinstance(item, dict):
            continue
        key, message = item.get("key"), str(item.get("message", ""))
        if key and key != "data":
            out.append(f"{message} - at `$.{key}`")
        else:
            out.append(message)
    return out or [exc.detail]


def _headers(exc: Exception, status: int) -> dict[str, str]:
    headers = dict(getattr(exc, "headers", None) or {})
    if isinstance(exc, EngineUnavailableError):
        headers.setdefault("Retry-After", str(exc.retry_after))
    if status == 503:
        headers.setdefault("Retry-After", "5")
    return headers


# Expected 503s: the gateway chose to refuse (model loading, failed, restarting, overloaded,
# rate-limit store down). One warning line each, no traceback; the cause is in /ready.
_EXPECTED: Final = (ModelUnavailableError, EngineUnavailableError, RateLimitStoreError)
# Expected 502s: a known condition the operator must fix (an upstream that cannot serve this
# model as configured, a refused account or key). Its traceback is the request path down to the
# raise, the same on every request until someone acts: one error line with the cause instead.
# Timeouts (504) too: the engine or upstream was slower than a limit (the model's timeout_s, an
# upstream's read_timeout_s, or the upstream's own), and the message names the model, what timed
# out and the limit; the traceback is the same asyncio or HTTP client path on every slow request.
# Anything else (a 500 is a bug) keeps its traceback.
_KNOWN_FAILURES: Final = (EngineMisconfiguredError, EngineAccountError, EngineTimeoutError, AdminUnavailableError)


def _body_too_large(request: Request[Any, Any, Any]) -> str:
    settings = getattr(request.app.state, "settings", None)
    limit = settings.limits.max_body_bytes if settings is not None else None
    size = f" of {limit} bytes" if limit is not None else ""
    return f"request body is larger than the limit{size} (limits.max_body_bytes)"


def describe_error(request: Request[Any, Any, Any], exc: Exception) -> tuple[int, str, str, dict[str, str]]:
    """Status, client-safe message, request id and headers of ``exc``; logs 5xx.

    The Cohere body below and the other dialects' bodies (``gateway.http.dialects``) are all built
    from this one table; a dialect only renames a status where its server uses another code.
    """
    status = classify(exc)
    message = _message(exc, status)
    if status == 413 and isinstance(exc, HTTPException):  # Litestar's own: "Request Entity Too Large"
        message = _body_too_large(request)
    request_id = str(request.scope.get("state", {}).get("request_id", ""))
    if status >= 500:
        if isinstance(exc, _EXPECTED):
            log.warning(
                "request_refused", request_id=request_id, status=status, error=type(exc).__name__, reason=message
            )
        elif isinstance(exc, _KNOWN_FAILURES):  # the exception's own text: it may name what the client's does not
            log.error("request_failed", request_id=request_id, status=status, error=type(exc).__name__, reason=str(exc))
        else:
            log.error("request_failed", request_id=request_id, status=status, error=type(exc).__name__, exc_info=exc)
    return status, message, request_id, _headers(exc, status)


def error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    status, message, request_id, headers = describe_error(request, exc)
    return Response(
        ErrorBody(message=message, id=request_id, detail=message),
        status_code=status,
        headers=headers,
    )


def exception_handlers() -> dict[type[Exception] | int, Any]:
    """Register one handler for everything, so no error leaves without the Cohere body."""
    return {Exception: error_response, HTTPException: error_response}
