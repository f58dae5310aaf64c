"""The admin API's keys: a shared store in Redis and the changes the API makes to it.

Who owns a key (docs/operating-teams.md): a key in the config file (``[[auth.keys]]``, made with
``rerank-gateway keys create``) belongs to the file and changes only when the file does (SIGHUP
or a restart); a key made through the admin API belongs to Redis (``limits.redis_url``) and
changes only through the API. The gateway serves the union; an id cannot be in both (the API
refuses a file key's id with 409, and a file key wins over a Redis key that later takes its id).

Redis holds one hash, id -> the key's ``ApiKeyConfig`` as JSON (its SHA-256, never the key), and
a version counter bumped by every change in the same Lua script. Every replica polls the version
every ``auth.sync_interval_s`` (0.25 s by default) and re-reads the hash when it moved, so a
revoked key is refused everywhere within that interval plus one round trip. A poll rather than
pub/sub: a missed message would leave a replica on stale keys until the next change, while a
poll converges by itself after any outage. Every change writes one ``admin_audit`` log line:
who (the admin key's id), what (action, key id, changed fields), when (the line's timestamp);
never a secret or a hash.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import msgspec
import structlog

from gateway.errors import KeyConflictError, KeyNotFoundError
from gateway.security.auth import generate_key, hash_key
from schemas.admin import KeyChange, KeyCreate, KeyCreated, KeyInfo
from schemas.config import ApiKeyConfig

__all__ = ("SharedKeys", "change_key", "create_key", "key_info", "revoke_key")

log = structlog.get_logger("gateway.admin")

_KEYS: Final = "rerank-gateway:keys"
_VERSION: Final = "rerank-gateway:keys:version"
_decoder = msgspec.json.Decoder(ApiKeyConfig)

# ARGV[1]: "create" (only if absent), "replace" (only if present) or "delete"; ARGV[2] id;
# ARGV[3] the entry's JSON. Returns 1 when done (and the version moved), else 0.
_CHANGE: Final = """
local exists = redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1
if (ARGV[1] == 'create' and exists) or (ARGV[1] ~= 'create' and not exists) then
    return 0
end
if ARGV[1] == 'delete' then
    redis.call('HDEL', KEYS[1], ARGV[2])
else
    redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
end
redis.call('INCR', KEYS[2])
return 1
"""


class SharedKeys:
    """The admin API's keys in Redis; calls raise redis-py's errors."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._change = client.register_script(_CHANGE)

    async def version(self) -> int:
        return int(await self._client.get(_VERSION) or 0)

    async def load(self) -> tuple[int, tuple[ApiKeyConfig, ...]]:
        pipe = self._client.pipeline(transaction=True)  # the version and the keys it names, together
        pipe.get(_VERSION)
        pipe.hgetall(_KEYS)
        version, raw = await pipe.execute()
        keys = []
        for name, value in sorted(raw.items()):
            try:
                keys.append(_decoder.decode(value))
            except msgspec.ValidationError as exc:  # written by another version of the gateway
                log.error("admin_key_unreadable", key_id=name.decode(errors="replace"), error=str(exc))
        return int(version or 0), tuple(keys)

    async def get(self, key_id: str) -> ApiKeyConfig | None:
        raw = await self._client.hget(_KEYS, key_id)
        return None if raw is None else _decoder.decode(raw)

    async def write(self, action: str, key_id: str, entry: ApiKeyConfig | None = None) -> bool:
        body = b"" if entry is None else msgspec.json.encode(entry)
        return bool(await self._change(keys=[_KEYS, _VERSION], args=[action, key_id, body]))


def key_info(key: ApiKeyConfig, source: str) -> KeyInfo:
    fields = {f: getattr(key, f) for f in KeyInfo.__struct_fields__ if f != "source"}
    return KeyInfo(source=source, **fields)  # type: ignore[arg-type]


def _audit(actor: str, action: str, key_id: str, **what: Any) -> None:
    log.info("admin_audit", actor=actor, action=action, target=key_id, at=datetime.now(UTC).isoformat(), **what)


def _changed(entry: KeyCreate | KeyChange) -> dict[str, Any]:
    """The fields a change sets, for the audit line (a KeyCreate/KeyChange carries no secret)."""
    out = {}
    for name in entry.__struct_fields__:
        value = getattr(entry, name)
        if value is not msgspec.UNSET and name != "id":
            out[name] = value.isoformat() if isinstance(value, datetime) else value
    return out


async def create_key(store: SharedKeys, file_ids: frozenset[str], actor: str, body: KeyCreate) -> KeyCreated:
    if body.id in file_ids:
        raise KeyConflictError(f"key id '{body.id}' is in the config file, which owns it; choose another id")
    secret = generate_key()
    fields = {name: getattr(body, name) for name in body.__struct_fields__}
    entry = ApiKeyConfig(hash=hash_key(secret), **fields)
    if not await store.write("create", body.id, entry):
        raise KeyConflictError(f"key id '{body.id}' exists already; change it (PATCH) or choose another id")
    _audit(actor, "create", body.id, **_changed(body))
    return KeyCreated(key=key_info(entry, "admin"), secret=secret)


async def change_key(store: SharedKeys, file_ids: frozenset[str], actor: str, key_id: str, body: KeyChange) -> KeyInfo:
    current = await _owned(store, file_ids, key_id, "changed")
    changes = {name: value for name, value in msgspec.structs.asdict(body).items() if value is not msgspec.UNSET}
    entry = msgspec.structs.replace(current, **changes)
    if not await store.write("replace", key_id, entry):
        raise KeyNotFoundError(f"no key '{key_id}' (revoked meanwhile)")
    _audit(actor, "change", key_id, **_changed(body))
    return key_info(entry, "admin")


async def revoke_key(store: SharedKeys, file_ids: frozenset[str], actor: str, key_id: str) -> None:
    await _owned(store, file_ids, key_id, "revoked")
    if not await store.write("delete", key_id):
        raise KeyNotFoundError(f"no key '{key_id}' (revoked meanwhile)")
    _audit(actor, "revoke", key_id)


async def _owned(store: SharedKeys, file_ids: frozenset[str], key_id: str, what: str) -> ApiKeyConfig:
    if key_id in file_ids:
        raise KeyConflictError(
            f"key '{key_id}' is in the config file, which owns it: it is {what} by editing the file "
            "(then SIGHUP or a restart), not through the admin API"
        )
    current = await store.get(key_id)
    if current is None:
        raise KeyNotFoundError(f"no key '{key_id}'")
    return current
