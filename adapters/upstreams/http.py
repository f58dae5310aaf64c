"""What every HTTP upstream engine shares: the pooled client, error mapping and retry policy.

- One pooled client per engine, kept for the engine's life: keep-alive connections are reused
  across requests (a TLS handshake to DashScope costs more than a small rerank). DashScope uses
  ``httpx.AsyncClient``; the pool's hot path uses an ``aiohttp.ClientSession``
  (:func:`make_session`): measured on the 2-core box against the stub upstream, one 56 kB
  rerank call cost 1.9-2.9 ms of client CPU through httpx (httpcore's pool scan over anyio
  streams grows with concurrency) and 0.24-0.47 ms through aiohttp (C parser, O(1) pool), not growing
  from 1 to 32 concurrent calls; httpx on aiohttp's transport (httpx-aiohttp) sat between, at
  0.75-1.1 ms (an ad-hoc run at load ~5; the committed run at load 12-15 in
  docs/benchmarks/cpu-2026-12-01 keeps the order: 0.43-0.95, 3.4-5.5 and 1.5-1.9 ms).
- Transport failures and upstream statuses become :mod:`adapters.base` errors here, once, so the
  gateway's single error table gives every upstream the same client-facing statuses.
- Retries use tenacity: exponential backoff with jitter, at least the upstream's
  ``Retry-After``, and never past the request's total time budget (a retry that could not
  finish in time is not started: the client gets 503 + Retry-After instead of a late 504).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import httpx
import msgspec
import tenacity

from adapters import tracing
from adapters.base import (
    EngineConfigError,
    EngineError,
    EngineOverloadedError,
    EngineTimeoutError,
    EngineUnavailableError,
)

__all__ = (
    "RetryableUpstreamError",
    "answer_limit",
    "call_with_retries",
    "gather_or_cancel",
    "make_client",
    "make_session",
    "map_aiohttp_error",
    "map_transport_error",
    "parse_retry_after",
    "post_bounded",
    "read_api_key",
    "resolve_api_key",
    "upstream_message",
)

T = TypeVar("T")

# Upstream error text is shown to clients (422) and logged: keep it to one bounded line.
_MAX_MESSAGE = 500
# An answer is bounded by its request (vLLM echoes every document, in JSON as the request had
# them): a larger body is broken or padded and is not read into memory (see answer_limit).
_ANSWER_FLOOR = 16 * 1024 * 1024


def answer_limit(request_bytes: int) -> int:
    """Most bytes an upstream answer to a ``request_bytes`` long request body may have."""
    return _ANSWER_FLOOR + 4 * request_bytes


class RetryableUpstreamError(EngineUnavailableError):
    """A call failed in a way worth retrying (429, 5xx, connect error); 503 if retries run out."""

    def __init__(self, message: str, *, wait_hint: float | None = None) -> None:
        super().__init__(message, retry_after=max(1, math.ceil(wait_hint or 1)))
        # Seconds the upstream asked us to wait (Retry-After), if it said.
        self.wait_hint = wait_hint


def make_client(
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_connections: int,
    base_url: str = "",
    headers: dict[str, str] | None = None,
) -> httpx.AsyncClient:
    """A keep-alive client with the model's timeouts (the total is enforced by the caller)."""
    return httpx.AsyncClient(
        base_url=base_url,
        headers=headers,
        # pool: how long a call may wait for a free connection; a full pool is an overload.
        timeout=httpx.Timeout(
            connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s, pool=connect_timeout_s
        ),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        follow_redirects=False,
    )


def make_session(
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_connections: int,
    headers: dict[str, str] | None = None,
) -> aiohttp.ClientSession:
    """A keep-alive aiohttp session: at most ``max_connections`` open, reused across replicas' calls.

    ``sock_connect`` bounds the TCP connect, ``sock_read`` every read of the answer; waiting for
    a free connection is bounded by the model's ``timeout_s`` (the caller's total). Proxies from
    the environment are not applied: replicas are addressed directly (and reading the proxy
    variables costs on every call).
    """
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=30)
    return aiohttp.ClientSession(
        connector=connector,
        headers=headers,
        timeout=aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        ),
        auto_decompress=True,
        trust_env=False,
        raise_for_status=False,
    )


def map_aiohttp_error(exc: BaseException, upstream: str, *, read_timeout_s: float) -> EngineError:
    """:func:`map_transport_error` for aiohttp's exceptions (same classes, same statuses)."""
    kind = type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        # Nothing reached the upstream: safe to retry, here or on another replica.
        return RetryableUpstreamError(f"{upstream} is unreachable ({kind})")
    if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
        return _read_timeout(upstream, read_timeout_s, kind)
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
        # The connection broke (a replica going down, a stale keep-alive connection). Scoring
        # has no side effects, so sending the request again is safe.
        return RetryableUpstreamError(f"{upstream} dropped the connection ({kind})")
    return EngineError(f"{upstream} call failed ({kind})")


def resolve_api_key(api_key: str | None, api_key_env: str | None) -> str | None:
    """The configured key, else the named environment variable's value (None if neither)."""
    if api_key:
        return api_key
    if api_key_env:
        return os.environ.get(api_key_env) or None
    return None


def read_api_key(api_key: str | None, api_key_file: str | None, api_key_env: str | None) -> str | None:
    """``api_key``, else the stripped contents of ``api_key_file``, else the ``api_key_env`` variable.

    A file that cannot be read raises :class:`EngineConfigError` naming the setting and the error's
    kind only (never the contents); an empty file is no key.
    """
    if api_key:
        return api_key
    if api_key_file:
        try:
            with open(api_key_file, encoding="utf-8") as file:
                return file.read().strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            raise EngineConfigError(
                f"api_key_file: cannot read the key file ({type(exc).__name__}); check the path and its permissions"
            ) from None
    return resolve_api_key(None, api_key_env)


async def post_bounded(
    client: httpx.AsyncClient, path: str, body: bytes, *, upstream: str, read_timeout_s: float
) -> tuple[httpx.Response, bytes]:
    """POST a JSON ``body``; the answer's status/headers and its whole body, at most
    :func:`answer_limit` bytes (streamed, so a larger body is refused without being held).
    Transport failures are mapped by :func:`map_transport_error`."""
    limit = answer_limit(len(body))
    # One client span per call (a retry is another); the upstream gets it as its traceparent.
    span = tracing.start("upstream.call", {"rerank.target": upstream, "http.request.body.size": len(body)})
    outcome = "cancelled"
    try:
        async with client.stream("POST", path, content=body, headers=tracing.headers(span, _JSON)) as response:
            outcome = str(response.status_code) if response.status_code != 200 else "ok"
            length = response.headers.get("content-length", "")
            if length.isascii() and length.isdigit() and (len(length) > 18 or int(length) > limit):
                raise EngineError(f"{upstream} answered over {limit} bytes")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():  # decoded: a gzip bomb counts as what it holds
                size += len(chunk)
                if size > limit:
                    raise EngineError(f"{upstream} answered over {limit} bytes")
                chunks.append(chunk)
    except httpx.TransportError as exc:
        outcome = type(exc).__name__
        raise map_transport_error(exc, upstream, read_timeout_s=read_timeout_s) from None
    except httpx.RequestError as exc:
        # Not a transport error but as much the upstream's fault: a body that does not decode
        # (corrupt gzip), redirects without end. A 502, and a chain moves on.
        outcome = type(exc).__name__
        raise EngineError(f"{upstream} sent an answer that could not be read ({outcome})") from None
    except EngineError:
        outcome = "answer_too_large"
        raise
    finally:
        tracing.end(span, outcome)
    return response, b"".join(chunks)


_JSON = {"Content-Type": "application/json"}


def map_transport_error(exc: httpx.TransportError, upstream: str, *, read_timeout_s: float) -> EngineError:
    """The adapters.base error for a failed HTTP exchange (the message never holds secrets)."""
    kind = type(exc).__name__
    if isinstance(exc, httpx.PoolTimeout):
        # Our own connection pool is full: the gateway is overloaded, the upstream is not at fault.
        return EngineOverloadedError(f"no free connection to {upstream} ({kind})", retry_after=1)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        # Nothing reached the upstream: safe to retry, here or on another replica.
        return RetryableUpstreamError(f"{upstream} is unreachable ({kind})")
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        # The connection broke (a replica going down, a stale keep-alive connection). Scoring
        # has no side effects, so sending the request again is safe.
        return RetryableUpstreamError(f"{upstream} dropped the connection ({kind})")
    if isinstance(exc, httpx.TimeoutException):  # read or write: make_client gives both read_timeout_s
        return _read_timeout(upstream, read_timeout_s, kind)
    return EngineError(f"{upstream} call failed ({kind})")


def _read_timeout(upstream: str, read_timeout_s: float, kind: str) -> EngineTimeoutError:
    # The limit and its setting are named: the 504's log line is one line, no traceback
    # (gateway.errors), so it must say which limit to look at. Clients get a generic 504 message.
    return EngineTimeoutError(f"{upstream} sent nothing for {read_timeout_s:g}s (read_timeout_s, {kind})")


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


class _AnyError(msgspec.Struct):
    # DashScope: code/message (or msg); vLLM: error{message} or flat message; TEI: error;
    # FastAPI (Infinity): detail; Cohere: message.
    message: Any = None
    msg: Any = None
    error: Any = None
    detail: Any = None
    code: Any = None


def upstream_message(body: bytes, fallback: str) -> tuple[str, str | None]:
    """(message, code) from an upstream error body in any of the common envelopes."""
    try:
        err = msgspec.json.decode(body, type=_AnyError)
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = body.decode("utf-8", "replace").strip()
        return (text[:_MAX_MESSAGE] or fallback), None
    nested = err.error if isinstance(err.error, dict) else {}
    for candidate in (err.message, err.msg, nested.get("message"), err.error, err.detail):
        if isinstance(candidate, str) and candidate:
            code = err.code if isinstance(err.code, str) else nested.get("type")
            return candidate[:_MAX_MESSAGE], code if isinstance(code, str) else None
        if isinstance(candidate, list) and candidate:  # FastAPI validation errors
            return msgspec.json.encode(candidate).decode()[:_MAX_MESSAGE], None
    return fallback, None


async def gather_or_cancel(*calls: Awaitable[T]) -> list[T]:
    """``asyncio.gather``, but the first failure cancels the other calls: their answers would
    be thrown away, and they hold upstream capacity and rate-limit quota meanwhile."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _wait(initial_s: float, max_s: float) -> Callable[[tenacity.RetryCallState], float]:
    # initial, 2x, 4x ... capped at max_s, plus up to `initial_s` of jitter so that clients
    # throttled together do not retry together.
    backoff = tenacity.wait_exponential(multiplier=initial_s, max=max_s) + tenacity.wait_random(0, initial_s)

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hint = getattr(exc, "wait_hint", None)
        # The upstream's Retry-After is a floor: retrying earlier only earns another 429.
        return max(backoff(state), hint or 0.0)

    return wait


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    retries: int,
    initial_s: float,
    max_s: float,
    budget_s: float,
) -> T:
    """Run ``call``; on :class:`RetryableUpstreamError` retry up to ``retries`` times.

    A retry whose wait would end after ``budget_s`` (from the first attempt) is not made;
    the last error is raised as it is (503 with the upstream's Retry-After).
    """
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(retries + 1) | tenacity.stop_before_delay(budget_s),
        wait=_wait(initial_s, max_s),
        retry=tenacity.retry_if_exception_type(RetryableUpstreamError),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover
