"""A request cancelled twice (its client left, then the server shuts down) still releases its
max_concurrent slot: the second cancellation used to interrupt the release in flight (a Redis
ZREM; anyio's shielded scope does not hold off asyncio's own Task.cancel()), leaving the lease
to expire minutes later while the key got 429s."""

from __future__ import annotations

import asyncio

import pytest

from gateway.security.ratelimit import KeyLimiter
from gateway.security.ratelimit_backend import _Backend, _LocalSlots
from schemas.config import ApiKeyConfig, LimitsConfig

KEY = ApiKeyConfig(id="k", hash="sha256:" + "0" * 64, models=("*",), rpm=100, max_concurrent=1)


class _IoSlots(_LocalSlots):
    """Slots whose release does I/O, like Redis' ZREM: it suspends before it counts."""

    async def release(self, key_id: str, lease: str) -> None:
        await asyncio.sleep(0.05)
        await super().release(key_id, lease)


async def _limiter() -> tuple[KeyLimiter, _IoSlots]:
    from limits.aio.storage import MemoryStorage

    limiter = KeyLimiter(LimitsConfig())
    await limiter.start()
    slots = _IoSlots()
    limiter._local = _Backend(MemoryStorage(), slots)
    return limiter, slots


async def _cancel_twice(task: asyncio.Task, between_s: float = 0.01) -> None:
    task.cancel()  # the client disconnected
    await asyncio.sleep(between_s)  # the release is in flight now
    task.cancel()  # the server shuts down
    with pytest.raises(asyncio.CancelledError):
        await task


def test_second_cancel_during_finish_still_releases_the_slot() -> None:
    async def main() -> None:
        limiter, slots = await _limiter()
        admitted = asyncio.Event()

        async def request() -> None:
            admission = await limiter.admit(KEY)
            try:
                admitted.set()
                await asyncio.sleep(10)
            finally:
                await limiter.finish(admission, 0)

        task = asyncio.create_task(request())
        await admitted.wait()
        await _cancel_twice(task)
        assert slots._in_flight["k"] == 0
        # The key is admitted again (its only slot is free).
        again = await limiter.admit(KEY)
        await limiter.finish(again, 0)
        assert slots._in_flight["k"] == 0  # released exactly once each

    asyncio.run(main())


def test_second_cancel_during_a_refused_admission_still_releases_the_slot() -> None:
    async def main() -> None:
        limiter, slots = await _limiter()
        checking = asyncio.Event()
        original = limiter._local._moving.hit

        async def slow_hit(*args, **kwargs):  # the rpm check in flight when the client leaves
            checking.set()
            await asyncio.sleep(10)
            return await original(*args, **kwargs)

        limiter._local._moving.hit = slow_hit
        task = asyncio.create_task(limiter.admit(KEY))
        await checking.wait()
        await _cancel_twice(task)
        assert slots._in_flight["k"] == 0

    asyncio.run(main())
