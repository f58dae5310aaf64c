"""API keys: generation, hashing, lookup from request headers, expiry and model scoping.

Keys are random 256-bit strings, so the config stores a plain SHA-256 of each: with that much
entropy a hash cannot be reversed or brute-forced, and a slow password hash (bcrypt, argon2)
would only add latency to every request. A presented key is hashed once and compared with
every configured hash using :func:`hmac.compare_digest`, without stopping at the first match,
so the time taken says nothing about which hash (or how much of one) matched.

Scopes are matched against the canonical model name a request resolves to (after aliases), so
neither an alias nor another route (``/rerank``, ``/v2/rerank``, ...) can widen a key's access.
Nothing here logs or returns a key or its hash; callers identify a key by its ``id``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase

from gateway.config.settings import ConfigError
from gateway.errors import AuthError, ForbiddenModelError
from schemas.config import ApiKeyConfig, Settings

__all__ = (
    "KEY_PREFIX",
    "KeyStore",
    "RequestAccess",
    "authorize_model",
    "check_exposure",
    "current_key_id",
    "current_key_is_admin",
    "generate_key",
    "hash_key",
    "is_loopback",
    "presented_key",
    "record_usage",
    "request_access",
    "scope_warnings",
)

# A recognisable prefix lets secret scanners (and people) spot leaked keys.
KEY_PREFIX = "rk-"
_HASH_SCHEME = "sha256:"
# RFC 6750 says the client should learn why its token was refused.
_INVALID_TOKEN = {"WWW-Authenticate": 'Bearer realm="rerank-gateway", error="invalid_token"'}


def generate_key() -> str:
    """A new random key: the prefix plus 256 bits from the OS CSPRNG, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The config form of a key: ``sha256:<hex>``."""
    return _HASH_SCHEME + hashlib.sha256(key.encode("utf-8")).hexdigest()


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The key from ``Authorization: Bearer <key>`` (any case of "Bearer") or ``X-API-Key``.

    ``Authorization`` wins when both are sent; an ``Authorization`` header with another scheme
    (Basic, ...) is ignored so that ``X-API-Key`` still works behind proxies that add one.
    """
    api_key_header: str | None = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key":
            api_key_header = value.decode("latin-1").strip() or None
    return api_key_header


class KeyStore:
    """The configured keys; authenticates requests and checks model scopes."""

    def __init__(self, keys: Sequence[ApiKeyConfig]) -> None:
        ids: set[str] = set()
        hashes: set[str] = set()
        for key in keys:
            if key.id in ids:
                raise ConfigError(f"invalid config: auth.keys: id {key.id!r} is used twice")
            if key.hash in hashes:
                # Never quote the hash: it is key material for this purpose.
                raise ConfigError(f"invalid config: auth.keys: key {key.id!r} has the same hash as another key")
            ids.add(key.id)
            hashes.add(key.hash)
        self._keys = tuple(keys)
        self._digests = tuple(bytes.fromhex(k.hash.removeprefix(_HASH_SCHEME)) for k in keys)

    @property
    def keys(self) -> tuple[ApiKeyConfig, ...]:
        return self._keys

    @property
    def enabled(self) -> bool:
        """Keys are configured, so every protected request needs one."""
        return bool(self._keys)

    def authenticate(self, headers: Iterable[tuple[bytes, bytes]], now: datetime | None = None) -> ApiKeyConfig:
        """The key the request presents, or :class:`AuthError` (401)."""
        key = presented_key(headers)
        if key is None:
            raise AuthError("no API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        found: ApiKeyConfig | None = None
        for config, expected in zip(self._keys, self._digests, strict=True):
            # No early exit: every comparison runs whatever matched.
            if hmac.compare_digest(digest, expected):
                found = config
        if found is None:
            raise _auth_error("invalid API key")
        if found.expires_at is not None and _as_utc(found.expires_at) <= (now or datetime.now(UTC)):
            raise _auth_error(f"API key '{found.id}' expired at {_as_utc(found.expires_at).isoformat()}")
        return found

    @staticmethod
    def authorize_model(key: ApiKeyConfig, model: str) -> None:
        """Raise :class:`ForbiddenModelError` (403) unless ``model`` (canonical name) is in scope."""
        if not any(fnmatchcase(model, pattern) for pattern in key.models):
            raise ForbiddenModelError(f"API key '{key.id}' is not allowed to use model '{model}'")


def scope_warnings(settings: Settings) -> list[str]:
    """One line per key scope that matches no configured model: its requests would all get 403.

    A warning, not a refusal: a key may be made before its model is deployed, and removing a
    model must not stop the gateway from starting because a key still names it.
    """
    names = [m.name for m in settings.models]
    aliases = {alias: m.name for m in settings.models for alias in m.aliases}
    out = []
    for i, key in enumerate(settings.auth.keys):
        for pattern in key.models:
            if not names or any(fnmatchcase(name, pattern) for name in names):
                continue
            where = f"auth.keys[{i}] ({key.id}): models entry {pattern!r}"
            if pattern in aliases:
                canonical = aliases[pattern]
                out.append(
                    f"{where} is an alias of {canonical!r}: scopes match canonical names only, write {canonical!r}"
                )
            else:
                out.append(
                    f"{where} matches no configured model (canonical names: {', '.join(names)}), so it allows nothing now"
                )
    return out


def _auth_error(message: str) -> AuthError:
    error = AuthError(message)
    error.headers = dict(_INVALID_TOKEN)
    return error


def _as_utc(moment: datetime) -> datetime:
    # TOML local datetimes carry no offset; the docs say they are read as UTC.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname other than localhost may resolve anywhere


def check_exposure(settings: Settings) -> None:
    """Refuse to serve without keys on a non-loopback address unless ``auth.open`` says so."""
    if settings.auth.keys or settings.auth.open or is_loopback(settings.server.host):
        return
    raise ConfigError(
        f"refusing to serve on {settings.server.host} without API keys: set RERANK_API_KEY (or "
        "RERANK_API_KEY_FILE, a file holding the key), or add [[auth.keys]] (see `rerank-gateway keys "
        "create`), or set auth.open = true to serve without authentication"
    )


@dataclass(slots=True)
class Usage:
    documents: int
    tokens: int
    search_units: int


@dataclass(slots=True)
class RequestAccess:
    """Who is calling (set by the access middleware) and what the request used (set by the service)."""

    key: ApiKeyConfig | None  # None: the gateway has no keys (open)
    label: str  # the key id, or a placeholder: what logs and metrics show
    model: str | None = None  # canonical model name once resolved
    usage: Usage | None = None


_current: ContextVar[RequestAccess | None] = ContextVar("rerank_request_access", default=None)


@contextmanager
def request_access(access: RequestAccess) -> Iterator[RequestAccess]:
    """Make ``access`` the current request's caller for :func:`authorize_model` / :func:`record_usage`."""
    token = _current.set(access)
    try:
        yield access
    finally:
        _current.reset(token)


def authorize_model(model: str) -> None:
    """Called by the service with the canonical model name: 403 unless the caller's key covers it.

    Outside an HTTP request (the service used as a library) there is no caller and no check;
    every HTTP route runs under the access middleware, so no route can skip it.
    """
    access = _current.get()
    if access is None:
        return
    access.model = model
    if access.key is not None:
        KeyStore.authorize_model(access.key, model)


def current_key_id() -> str | None:
    """The id of the key the current request presented; None without keys or outside a request."""
    access = _current.get()
    return access.key.id if access is not None and access.key is not None else None


def current_key_is_admin() -> bool:
    """The current request presented an admin key (``admin = true``)."""
    access = _current.get()
    return access is not None and access.key is not None and access.key.admin


def record_usage(*, documents: int, tokens: int, search_units: int) -> None:
    """Called by the service after scoring: what the request used, for tpm and usage metrics."""
    access = _current.get()
    if access is not None:
        # Added up: one vLLM /score request with several queries is several service calls.
        prev = access.usage
        if prev is not None:
            documents, tokens = documents + prev.documents, tokens + prev.tokens
            search_units += prev.search_units
        access.usage = Usage(documents, tokens, search_units)
