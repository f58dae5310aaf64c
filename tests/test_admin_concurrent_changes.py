"""Two admin changes of one key at once, against a real redis-server: both kept (compare-and-set).

Before, a PATCH read the key, applied its fields and wrote the whole entry back: two PATCHes
that read the same entry each wrote it with only their own field changed, and the second erased
the first (a lost update: an rpm limit set and silently gone). The store below pauses every
change between its read and its write until both have read, so the two always interleave."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import KeyConflictError, KeyNotFoundError
from gateway.security.admin import SharedKeys, change_key, create_key, revoke_key
from schemas.admin import KeyChange, KeyCreate
from tests.test_ratelimit_redis import on_flushed_redis as _run
from tests.test_ratelimit_redis import redis_url  # noqa: F401  (the real redis-server fixture)


class _Interleaving(SharedKeys):
    """Each ``get`` waits until ``readers`` gets have happened: the changes all read before any writes."""

    def __init__(self, client: Any, readers: int) -> None:
        super().__init__(client)
        self.barrier = asyncio.Barrier(readers)
        self.gets = 0

    async def get(self, key_id: str) -> bytes | None:
        raw = await super().get(key_id)
        self.gets += 1
        if self.gets <= self.barrier.parties:  # the first read of each change; their re-reads go on
            await self.barrier.wait()
        return raw


def test_two_changes_of_one_key_at_once_both_land(redis_url: str) -> None:
    async def body(client: Any) -> Any:
        await create_key(SharedKeys(client), frozenset(), "admin", KeyCreate(id="team-a", models=("*",)))
        store = _Interleaving(client, readers=2)
        await asyncio.gather(
            change_key(store, frozenset(), "admin", "team-a", KeyChange(rpm=60)),
            change_key(store, frozenset(), "admin", "team-a", KeyChange(tokens_per_day=1000)),
        )
        assert store.gets == 3  # one change wrote first; the other read again and applied itself to it
        return await SharedKeys(client).get("team-a")

    entry = _run(redis_url, body)
    assert b'"rpm":60' in entry and b'"tokens_per_day":1000' in entry


def test_a_change_racing_a_revoke_never_brings_the_key_back(redis_url: str) -> None:
    async def body(client: Any) -> Any:
        await create_key(SharedKeys(client), frozenset(), "admin", KeyCreate(id="team-b", models=("*",)))
        store = _Interleaving(client, readers=2)
        results = await asyncio.gather(
            change_key(store, frozenset(), "admin", "team-b", KeyChange(rpm=60)),
            revoke_key(store, frozenset(), "admin", "team-b"),
            return_exceptions=True,
        )
        return results, await SharedKeys(client).get("team-b")

    results, entry = _run(redis_url, body)
    assert entry is None  # revoked, whichever came first
    assert results[1] is None and (isinstance(results[0], KeyNotFoundError) or results[0].rpm == 60)


def test_a_change_that_keeps_losing_the_race_gives_up_with_409(redis_url: str) -> None:
    class _AlwaysChanged(SharedKeys):
        async def get(self, key_id: str) -> bytes | None:
            raw = await super().get(key_id)
            await change_key(SharedKeys(self._client), frozenset(), "other", key_id, KeyChange(rpm=self.n))
            self.n += 1
            return raw

    async def body(client: Any) -> Any:
        await create_key(SharedKeys(client), frozenset(), "admin", KeyCreate(id="team-c", models=("*",)))
        store = _AlwaysChanged(client)
        store.n = 1
        with pytest.raises(KeyConflictError, match="changed 5 times"):
            await change_key(store, frozenset(), "admin", "team-c", KeyChange(tpm=10))
        return await SharedKeys(client).get("team-c")

    entry = _run(redis_url, body)
    assert b'"tpm":null' in entry and b'"rpm":5' in entry  # the others' changes, never this one's
