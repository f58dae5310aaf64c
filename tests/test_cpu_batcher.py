"""The CPU runtime's cross-request batcher (adapters/runtimes/cpu/batcher.py), with fake runners:
rows come back to the request they came from, requests share batches (or never do, per-request),
an error fails only the requests in its batch, cancelling drops the rows not yet taken, the oldest
request is in every batch until done. Pure Python: no model, milliseconds per test."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from adapters.runtimes.cpu.batcher import RowBatcher

pytestmark = pytest.mark.anyio


class Fake:
    """A runner per stream: a row's output is its payload (a number); ``gate`` holds the first
    batch until set, so requests pile up behind it; payloads < 0 raise."""

    def __init__(self, gate: bool = False) -> None:
        self.seen: list[list[Any]] = []
        self.gate = threading.Event()
        if not gate:
            self.gate.set()
        self.lock = threading.Lock()

    def __call__(self, payloads: list[Any]) -> np.ndarray:
        self.gate.wait(10)
        with self.lock:
            self.seen.append(list(payloads))
        if any(p < 0 for p in payloads):
            raise ValueError("poisoned row")
        return np.array([[float(p), -float(p)] for p in payloads], dtype=np.float32)


def _batcher(fake: Fake, streams: int = 2, window: int = 10**6, **kw: Any) -> RowBatcher:
    kw.setdefault("batch_tokens", 400)
    kw.setdefault("max_batch_size", 4)
    return RowBatcher([fake] * streams, window_tokens=window, **kw)


def _rows(tag: int, n: int) -> tuple[list[int], list[int]]:
    """Payloads tag*1000+i (so a misrouted row shows), lengths spread 10..100."""
    return [tag * 1000 + i for i in range(n)], [10 + (i * 37) % 91 for i in range(n)]


async def test_concurrent_requests_share_batches_and_get_their_own_rows_back():
    fake = Fake(gate=True)
    b = _batcher(fake)
    try:
        jobs = [b.submit(*_rows(tag, 13 + tag)) for tag in range(1, 6)]
        await asyncio.sleep(0.05)
        fake.gate.set()
        outs = await asyncio.wait_for(asyncio.gather(*(j.future for j in jobs)), 10)
        for tag, out in zip(range(1, 6), outs, strict=True):
            want = np.array([[tag * 1000 + i, -(tag * 1000 + i)] for i in range(13 + tag)], dtype=np.float32)
            np.testing.assert_array_equal(out, want)
        stats = b.stats()
        assert stats["rows"] == sum(13 + t for t in range(1, 6))
        assert any(int(k) > 1 for k in stats["batches_by_requests"])  # rows of two requests in one batch
        assert all(len(s) <= 4 for s in fake.seen)
    finally:
        b.stop()


async def test_per_request_batching_never_mixes_requests():
    fake = Fake(gate=True)
    b = _batcher(fake, window=0)
    try:
        jobs = [b.submit(*_rows(tag, 9)) for tag in range(1, 4)]
        await asyncio.sleep(0.05)
        fake.gate.set()
        await asyncio.wait_for(asyncio.gather(*(j.future for j in jobs)), 10)
        assert set(b.stats()["batches_by_requests"]) == {"1"}
        assert all(len({p // 1000 for p in s}) == 1 for s in fake.seen)
    finally:
        b.stop()


async def test_oldest_request_is_in_every_batch_until_done():
    fake = Fake(gate=True)
    # The window holds the oldest request and the next one: the third waits for the first to finish.
    b = _batcher(fake, streams=1, window=sum(_rows(1, 12)[1]) + 1)
    try:
        first = b.submit(*_rows(1, 12))
        later = [b.submit(*_rows(tag, 12)) for tag in (2, 3)]
        await asyncio.sleep(0.05)
        fake.gate.set()
        await asyncio.wait_for(asyncio.gather(first.future, *(j.future for j in later)), 10)
        done_at = max(k for k, s in enumerate(fake.seen) if any(p // 1000 == 1 for p in s))
        assert all(any(p // 1000 == 1 for p in s) for s in fake.seen[: done_at + 1])
        assert not any(p // 1000 == 3 for s in fake.seen[:3] for p in s)  # outside the window at first
        assert done_at < len(fake.seen) - 1  # and it finished before the others
    finally:
        b.stop()


async def test_an_error_fails_only_the_requests_in_its_batch():
    fake = Fake(gate=True)
    # Long poisoned rows and short good rows never share a batch of 400 padded tokens.
    b = _batcher(fake, batch_tokens=400, max_batch_size=8)
    try:
        bad = b.submit([-1, -2, -3], [300, 300, 300])
        good = b.submit(*_rows(2, 6))
        await asyncio.sleep(0.05)
        fake.gate.set()
        with pytest.raises(ValueError, match="poisoned row"):
            await asyncio.wait_for(bad.future, 10)
        out = await asyncio.wait_for(good.future, 10)
        np.testing.assert_array_equal(out[:, 0], [2000 + i for i in range(6)])
        after = b.submit(*_rows(3, 5))  # the batcher keeps serving
        np.testing.assert_array_equal((await asyncio.wait_for(after.future, 10))[:, 0], [3000 + i for i in range(5)])
    finally:
        b.stop()


async def test_cancelling_drops_the_rows_no_batch_has_taken():
    fake = Fake(gate=True)
    b = _batcher(fake, streams=1, window=0, max_batch_size=2)
    try:
        doomed = b.submit(*_rows(1, 10))
        await asyncio.sleep(0.05)  # the worker holds its first batch (2 rows) at the gate
        b.cancel(doomed)
        fake.gate.set()
        survivor = b.submit(*_rows(2, 3))
        out = await asyncio.wait_for(survivor.future, 10)
        np.testing.assert_array_equal(out[:, 0], [2000, 2001, 2002])
        assert sum(1 for s in fake.seen for p in s if p // 1000 == 1) == 2
        assert b.stats()["dropped_rows"] == 8 and not doomed.future.done()
    finally:
        b.stop()


async def test_stop_fails_waiting_requests_and_refuses_new_ones():
    fake = Fake(gate=True)
    b = _batcher(fake, streams=1)
    first = b.submit(*_rows(1, 4))
    waiting = b.submit(*_rows(2, 4))
    await asyncio.sleep(0.05)
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    fake.gate.set()
    stopper.join(10)
    with pytest.raises(RuntimeError, match="engine stopped"):
        await asyncio.wait_for(waiting.future, 10)
    assert first.future.done()
    with pytest.raises(RuntimeError, match="stopping"):
        b.submit(*_rows(3, 1))
