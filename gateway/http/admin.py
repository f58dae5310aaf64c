"""The admin API: keys and usage, under ``/admin/v1/`` (docs/operating-teams.md).

Only admin keys (``admin = true``) reach these handlers: :class:`gateway.http.access.AccessMiddleware`
refuses every other caller with 401/403 before any of them runs, and applies no rate limit or
quota to them. Changes go to the shared key store (gateway.security.admin) and reach every
replica within ``auth.sync_interval_s``; this replica re-reads at once.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import TYPE_CHECKING, Annotated, Any

from litestar import Request, Response, Router, delete, get, patch, post
from litestar.exceptions import HTTPException
from litestar.params import FromPath, JSONBody, Parameter

from gateway.errors import (
    AdminOnlyError,
    AdminUnavailableError,
    InvalidRequestError,
    KeyNotFoundError,
    KeyStoreUnavailableError,
    error_response,
)
from gateway.http.decoding import StrictBody
from gateway.security.admin import SharedKeys, change_key, create_key, revoke_key
from gateway.security.auth import current_key_id, current_key_is_admin
from gateway.security.quotas import USAGE_RETENTION_DAYS
from schemas.admin import (
    KeyChange,
    KeyCreate,
    KeyCreated,
    KeyInfo,
    KeyList,
    QuotaReport,
    QuotaState,
    UsageEntry,
    UsageReport,
)

if TYPE_CHECKING:
    from gateway.http.access import AccessControl

__all__ = ("ADMIN_PREFIX", "ADMIN_ROUTES")

ADMIN_PREFIX = "/admin/"
_SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]
_TAGS = ["admin"]


def _admin_only(connection: Any, handler: Any) -> None:
    """Defence in depth: the access middleware refuses other keys before routing; this guard keeps
    an admin handler from ever running without an admin key (and off the direct rerank path)."""
    if not current_key_is_admin():
        raise AdminOnlyError("the admin API needs an admin key (admin = true)")


_GUARDS = [_admin_only]


def _control(request: Request[Any, Any, Any]) -> AccessControl:
    control: AccessControl = request.app.state.access
    return control


def _store(control: AccessControl) -> SharedKeys:
    if control.shared_keys is None:
        raise AdminUnavailableError(
            "the admin API needs the shared key store: set limits.redis_url (the Redis every replica uses)"
        )
    return control.shared_keys


def _actor() -> str:
    return current_key_id() or "-"


@post(
    "/admin/v1/keys",
    status_code=201,
    tags=_TAGS,
    security=_SECURITY,
    guards=_GUARDS,
    dto=StrictBody[KeyCreate],
    return_dto=None,
    summary="Create a key (its secret is in this answer only)",
)
async def create_admin_key(request: Request[Any, Any, Any], data: JSONBody[KeyCreate]) -> Response[KeyCreated]:
    control = _control(request)
    created = await create_key(_store(control), control.file_ids, _actor(), data)
    # The key is written: its secret must reach the caller even if this replica's re-read fails
    # (the poll catches up); a 503 here would lose a secret that is never shown again.
    await control.sync_keys_quietly()
    return Response(created, status_code=201)


@get(
    "/admin/v1/keys",
    tags=_TAGS,
    security=_SECURITY,
    guards=_GUARDS,
    summary="List keys (never their secrets or hashes)",
)
async def list_admin_keys(request: Request[Any, Any, Any]) -> KeyList:
    control = _control(request)
    await control.sync_keys()
    return KeyList(data=control.key_infos())


@get("/admin/v1/keys/{key_id:str}", tags=_TAGS, security=_SECURITY, guards=_GUARDS, summary="One key")
async def get_admin_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> KeyInfo:
    control = _control(request)
    await control.sync_keys()
    for info in control.key_infos():
        if info.id == key_id:
            return info
    raise KeyNotFoundError(f"no key '{key_id}'")


@patch(
    "/admin/v1/keys/{key_id:str}",
    tags=_TAGS,
    security=_SECURITY,
    guards=_GUARDS,
    dto=StrictBody[KeyChange],
    return_dto=None,
    summary="Change a key's models, admin flag, expiry, limits or quotas (null removes one)",
)
async def change_admin_key(
    request: Request[Any, Any, Any], key_id: FromPath[str], data: JSONBody[KeyChange]
) -> KeyInfo:
    control = _control(request)
    info = await change_key(_store(control), control.file_ids, _actor(), key_id, data)
    await control.sync_keys()
    return info


@delete("/admin/v1/keys/{key_id:str}", tags=_TAGS, security=_SECURITY, guards=_GUARDS, summary="Revoke a key")
async def revoke_admin_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> None:
    control = _control(request)
    await revoke_key(_store(control), control.file_ids, _actor(), key_id)
    await control.sync_keys()


@get(
    "/admin/v1/keys/{key_id:str}/quota",
    tags=_TAGS,
    security=_SECURITY,
    guards=_GUARDS,
    summary="A key's quotas: used so far in this day and month, and when each resets",
)
async def admin_key_quota(request: Request[Any, Any, Any], key_id: FromPath[str]) -> QuotaReport:
    control = _control(request)
    await control.sync_keys()
    key = control.key_config(key_id)
    states = await control.limiter.quota_status(key)
    return QuotaReport(
        key=key_id,
        timezone=control.limiter.calendar.zone.key,
        quotas=[
            QuotaState(quota=s.quota, limit=s.limit, used=s.used, remaining=s.remaining, resets_at=s.resets_at)
            for s in states
        ],
    )


@get(
    "/admin/v1/usage",
    tags=_TAGS,
    security=_SECURITY,
    guards=_GUARDS,
    summary="Usage per key and model over whole days (limits.quota_timezone), both ends included",
)
async def admin_usage(
    request: Request[Any, Any, Any],
    start: Annotated[date | None, Parameter(description="first day (default: the 1st of this month)")] = None,
    end: Annotated[date | None, Parameter(description="last day, included (default: today)")] = None,
    key: Annotated[str | None, Parameter(description="only this key id")] = None,
    model: Annotated[str | None, Parameter(description="only this model")] = None,
) -> UsageReport:
    control = _control(request)
    today = control.limiter.calendar.today()
    end = end or today
    start = start or end.replace(day=1)
    if start > end:
        raise InvalidRequestError(f"invalid request: start {start} is after end {end}")
    if end - start > timedelta(days=USAGE_RETENTION_DAYS):
        raise InvalidRequestError(
            f"invalid request: at most {USAGE_RETENTION_DAYS} days at once (usage is kept that long)"
        )
    rows = await control.limiter.usage(start, end)
    data = [
        UsageEntry(
            key=r.key,
            model=r.model,
            requests=r.requests,
            documents=r.documents,
            tokens=r.tokens,
            search_units=r.search_units,
        )
        for r in rows
        if (key is None or r.key == key) and (model is None or r.model == model)
    ]
    return UsageReport(start=start, end=end, timezone=control.limiter.calendar.zone.key, data=data)


def _store_failure(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """redis-py's errors (the shared store down or slow) are a 503 to retry, not a 500."""
    # Imported here, not at the top: importing redis loads OpenTelemetry's SDK where it is
    # installed, and gateway.app must import nothing of it while tracing is off.
    import redis.exceptions

    if isinstance(exc, redis.exceptions.RedisError | OSError):
        exc = KeyStoreUnavailableError("the shared key store (limits.redis_url) did not answer; retry later")
    return error_response(request, exc)


ADMIN_ROUTES = [
    Router(
        path="/",
        route_handlers=[
            create_admin_key,
            list_admin_keys,
            get_admin_key,
            change_admin_key,
            revoke_admin_key,
            admin_key_quota,
            admin_usage,
        ],
        exception_handlers={Exception: _store_failure, HTTPException: error_response},
    )
]
