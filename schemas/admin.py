"""Wire structs of the admin API (``/admin/v1/...``, gateway.http.admin).

Nothing here carries a key's hash; only :class:`KeyCreated` carries a secret, the new key itself,
in the one answer that creates it.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Literal

import msgspec

from schemas.config.base import ModelName, Positive
from schemas.config.server import KeyId

__all__ = (
    "KeyChange",
    "KeyCreate",
    "KeyCreated",
    "KeyInfo",
    "KeyList",
    "QuotaReport",
    "QuotaState",
    "UsageEntry",
    "UsageReport",
)

Models = Annotated[tuple[ModelName, ...], msgspec.Meta(min_length=1)]
OptionalPositive = Positive | None


class KeyCreate(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A new key: the same fields as an ``[[auth.keys]]`` entry, without ``hash`` (made here)."""

    id: KeyId
    models: Models
    admin: bool = False
    expires_at: datetime | None = None
    rpm: OptionalPositive = None
    tpm: OptionalPositive = None
    max_concurrent: OptionalPositive = None
    tokens_per_day: OptionalPositive = None
    tokens_per_month: OptionalPositive = None
    search_units_per_day: OptionalPositive = None
    search_units_per_month: OptionalPositive = None


class KeyChange(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Fields to change; a field left out keeps its value, ``null`` removes a limit or expiry."""

    models: Models | msgspec.UnsetType = msgspec.UNSET
    admin: bool | msgspec.UnsetType = msgspec.UNSET
    expires_at: datetime | None | msgspec.UnsetType = msgspec.UNSET
    rpm: OptionalPositive | msgspec.UnsetType = msgspec.UNSET
    tpm: OptionalPositive | msgspec.UnsetType = msgspec.UNSET
    max_concurrent: OptionalPositive | msgspec.UnsetType = msgspec.UNSET
    tokens_per_day: OptionalPositive | msgspec.UnsetType = msgspec.UNSET
    tokens_per_month: OptionalPositive | msgspec.UnsetType = msgspec.UNSET
    search_units_per_day: OptionalPositive | msgspec.UnsetType = msgspec.UNSET
    search_units_per_month: OptionalPositive | msgspec.UnsetType = msgspec.UNSET


class KeyInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A key as listed: never its secret or hash. ``source``: who owns it (docs/operating-teams.md)."""

    id: str
    source: Literal["file", "admin"]
    models: tuple[str, ...]
    admin: bool
    expires_at: datetime | None
    rpm: int | None
    tpm: int | None
    max_concurrent: int | None
    tokens_per_day: int | None
    tokens_per_month: int | None
    search_units_per_day: int | None
    search_units_per_month: int | None


class KeyCreated(msgspec.Struct, kw_only=True, frozen=True):
    key: KeyInfo
    # The new key, shown in this answer only: it is stored nowhere, only its SHA-256.
    secret: str


class KeyList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[KeyInfo]


class QuotaState(msgspec.Struct, kw_only=True, frozen=True):
    quota: str  # the key's field: tokens_per_day, search_units_per_month, ...
    limit: int
    used: int
    remaining: int
    resets_at: str  # ISO 8601, in limits.quota_timezone


class QuotaReport(msgspec.Struct, kw_only=True, frozen=True):
    key: str
    timezone: str
    quotas: list[QuotaState]


class UsageEntry(msgspec.Struct, kw_only=True, frozen=True):
    key: str
    model: str
    requests: int
    documents: int
    tokens: int
    search_units: int


class UsageReport(msgspec.Struct, kw_only=True, frozen=True):
    start: date  # first day, inclusive, in limits.quota_timezone
    end: date  # last day, inclusive
    timezone: str
    data: list[UsageEntry]
