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
poll converges by itself after any outage. A change (PATCH) is a compare-and-set: it is written
only if the key is still what the change read, else read again and re-applied (two admins
changing one key at once each keep their fields; a key revoked meanwhile stays revoked). Every
change writes one ``admin_audit`` log line:
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
# A change re-read and re-applied this many times (others changing the key meanwhile) gives up with 409.
_CHANGE_TRIES: Final = 5

# ARGV[1]: "create" (only if absent), "replace" (only if present) or "delete"; ARGV[2] id;
# ARGV[3] the entry's JSON; ARGV[4] (replace) the entry's JSON as the change read it. Returns 1
# when done (and the version moved), 0 when absent (present, for create), -1 when the entry is no
# longer what the change read (another change came first: read it again).
_CHANGE: Final = """
local current = redis.call('HGET', KEYS[1], ARGV[2])
local exists = current ~= false
if (ARGV[1] == 'create' and exists) or (ARGV[1] ~= 'create' and not exists) then
    return 0
end
if ARGV[1] == 'replace' and current ~= ARGV[4] then
    return -1
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

    async def get(self, key_id: str) -> bytes | None:
        """The key's entry as stored (JSON): what a ``replace`` names as the version it changes."""
        raw = await self._client.hget(_KEYS, key_id)
        return None if raw is None else bytes(raw)

    async def write(self, action: str, key_id: str, entry: ApiKeyConfig | None = None, read: bytes = b"") -> int:
        """1: done; 0: the key is absent (present, for "create"); -1 ("replace"): it is no longer ``read``."""
        body = b"" if entry is None else msgspec.json.encode(entry)
        return int(await self._change(keys=[_KEYS, _VERSION], args=[action, key_id, body, read]))


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
    changes = {name: value for name, value in msgspec.structs.asdict(body).items() if value is not msgspec.UNSET}
    for _ in range(_CHANGE_TRIES):
        read = await _owned(store, file_ids, key_id, "changed")
        entry = msgspec.structs.replace(_decoder.decode(read), **changes)
        done = await store.write("replace", key_id, entry, read)
        if done == 1:
            _audit(actor, "change", key_id, **_changed(body))
            return key_info(entry, "admin")
        if done == 0:
            raise KeyNotFoundError(f"no key '{key_id}' (revoked meanwhile)")
        # -1: another change came between the read and the write; apply this one to its result
    raise KeyConflictError(f"key '{key_id}' changed {_CHANGE_TRIES} times while this change was made; send it again")


async def revoke_key(store: SharedKeys, file_ids: frozenset[str], actor: str, key_id: str) -> None:
    await _owned(store, file_ids, key_id, "revoked")
    if not await store.write("delete", key_id):
        raise KeyNotFoundError(f"no key '{key_id}' (revoked meanwhile)")
    _audit(actor, "revoke", key_id)


async def _owned(store: SharedKeys, file_ids: frozenset[str], key_id: str, what: str) -> bytes:
    if key_id in file_ids:
        raise KeyConflictError(
            f"key '{key_id}' is in the config file, which owns it: it is {what} by editing the file "
            "(then SIGHUP or a restart), not through the admin API"
        )
    current = await store.get(key_id)
    if current is None:
        raise KeyNotFoundError(f"no key '{key_id}'")
    return current
