"""Length-bucketed batches across HTTP requests for the CPU runtime: one worker thread per stream.

Each worker, when its stream is free, plans the untaken rows of the oldest waiting requests
(``window_tokens`` of them, the oldest request always whole) into batches of neighbouring
lengths (``bucket_batches``) and runs the batch holding the oldest request's shortest untaken
row; the rows of each batch's output go back to the requests they came from. Consequences:

- concurrent requests share batches, so rows of equal length from two requests pad to one
  width instead of each request padding its own few rows of every length;
- the oldest request is in every batch until it is done (no starvation by newer short rows),
  and a request that arrives alone starts at once (no batching window);
- ``window_tokens = 0`` plans the oldest request alone: batches never mix requests, so a
  request's scores do not depend on what else is in flight (``batching = "per-request"``);
- an error in a batch fails the requests with rows in it and nothing else;
- cancelling a request drops its rows no batch has taken yet.

Pure Python + numpy (no OpenVINO): a runner is any ``run(payloads) -> (len, k) array`` that
one worker thread calls at a time.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from adapters.runtimes.futures import resolve_from_thread

__all__ = ("BatchJob", "RowBatcher", "bucket_batches")

Runner = Callable[[list[Any]], np.ndarray]


def bucket_batches(lengths: Sequence[int], *, batch_tokens: int, max_batch_size: int, parts: int) -> list[list[int]]:
    """Row indices in batches of neighbouring lengths (sorted), the fewest that keep every batch
    within ``batch_tokens`` padded tokens and ``max_batch_size`` rows, rounded up to a multiple
    of ``parts`` (the streams) when there are rows enough."""
    n = len(lengths)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda i: lengths[i])
    count = max(math.ceil(n / max_batch_size), math.ceil(sum(lengths) / batch_tokens))
    count = min(n, math.ceil(count / parts) * parts)
    while True:
        bounds = [round(k * n / count) for k in range(count + 1)]
        batches = [order[a:b] for a, b in itertools.pairwise(bounds) if b > a]
        if count >= n or all(len(b) * lengths[b[-1]] <= batch_tokens for b in batches):
            return batches
        count += 1


class BatchJob:
    """One ``score`` call: ``lengths[i]`` tokens of ``payloads[i]``, scored into ``out[i]``."""

    __slots__ = ("_loop", "cancelled", "done", "future", "lengths", "out", "payloads", "queued_at", "taken", "untaken")

    def __init__(self, payloads: Sequence[Any], lengths: Sequence[int], loop: asyncio.AbstractEventLoop) -> None:
        self.payloads, self.lengths = list(payloads), list(lengths)
        self.untaken = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i], reverse=True)  # pop() = shortest
        self.taken = False
        self.done = 0
        self.out: np.ndarray | None = None
        self.cancelled = False
        self.queued_at = time.perf_counter()
        self._loop = loop
        self.future: asyncio.Future[np.ndarray] = loop.create_future()

    def resolve(self, result: np.ndarray | BaseException) -> None:
        """Complete the future from a worker thread (the loop may be gone at shutdown)."""
        resolve_from_thread(self._loop, self.future, result)


class RowBatcher:
    def __init__(
        self,
        runners: Sequence[Runner],
        *,
        batch_tokens: int,
        max_batch_size: int,
        window_tokens: int,
        on_batch: Callable[[int, int], None] | None = None,
        error_type: type[Exception] = RuntimeError,
        name: str = "cpu-batcher",
    ) -> None:
        self._runners = list(runners)
        self._budget, self._max_rows, self._window = batch_tokens, max_batch_size, window_tokens
        self._on_batch, self._error_type = on_batch, error_type
        self._queue: list[BatchJob] = []  # jobs with rows no batch has taken, arrival order
        self._cond = threading.Condition()
        self._stopping = False
        # Counters (``stats``), written under the lock.
        self.batches = self.rows = self.tokens = self.padded_tokens = self.dropped_rows = 0
        self.busy_s = 0.0  # summed over the workers: inference time (idle gaps are what is left)
        self.batches_by_requests: collections.Counter[int] = collections.Counter()
        self._threads = [
            threading.Thread(target=self._work, args=(run,), name=f"{name}-{i}", daemon=True)
            for i, run in enumerate(self._runners)
        ]
        for t in self._threads:
            t.start()

    # -- event-loop side --------------------------------------------------------------------
    def submit(self, payloads: Sequence[Any], lengths: Sequence[int]) -> BatchJob:
        job = BatchJob(payloads, lengths, asyncio.get_running_loop())
        if not job.payloads:
            job.future.set_result(np.empty((0, 1), dtype=np.float32))
            return job
        with self._cond:
            if self._stopping:
                raise self._error_type("engine is stopping")
            self._queue.append(job)
            self._cond.notify()
        return job

    def cancel(self, job: BatchJob) -> None:
        """Drop the job's rows no batch has taken; batches already running finish and are ignored."""
        with self._cond:
            if job.cancelled:
                return
            job.cancelled = True
            if job in self._queue:
                self._queue.remove(job)
                self.dropped_rows += len(job.untaken)

    def waiting(self) -> int:
        """Jobs no batch has taken a row of yet."""
        with self._cond:
            return sum(1 for j in self._queue if not j.taken)

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            pending, self._queue = self._queue, []
            self._cond.notify_all()
        for job in pending:
            job.resolve(self._error_type("engine stopped"))
        for t in self._threads:
            t.join(timeout)

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {
                "batches": self.batches,
                "rows": self.rows,
                # Share of the computed tokens that were padding (rows padded to their batch's width).
                "padding": round(1 - self.tokens / self.padded_tokens, 4) if self.padded_tokens else 0.0,
                "tokens": self.tokens,
                "padded_tokens": self.padded_tokens,
                "busy_s": round(self.busy_s, 3),
                "streams": len(self._runners),
                "dropped_rows": self.dropped_rows,
                # {requests with rows in one batch: number of such batches}
                "batches_by_requests": {str(k): v for k, v in sorted(self.batches_by_requests.items())},
            }

    # -- worker threads ---------------------------------------------------------------------
    def _take(self) -> list[tuple[BatchJob, int]]:
        """The next batch (under the lock, queue not empty): plan the window, pick the batch
        holding the oldest job's shortest untaken row."""
        pool: list[tuple[int, BatchJob, int]] = []
        tokens = 0
        for job in self._queue:
            if pool and tokens >= self._window:
                break
            for i in job.untaken:
                pool.append((job.lengths[i], job, i))
                tokens += job.lengths[i]
        oldest = self._queue[0]
        anchor = oldest.untaken[-1]
        # bucket_batches sorts stably by length, so equal lengths keep arrival order.
        plan = bucket_batches(
            [p[0] for p in pool], batch_tokens=self._budget, max_batch_size=self._max_rows, parts=len(self._runners)
        )
        at = next(k for k, p in enumerate(pool) if p[1] is oldest and p[2] == anchor)
        batch = next(b for b in plan if at in b)
        taken = [(pool[k][1], pool[k][2]) for k in batch]
        for job, i in taken:
            job.untaken.remove(i)
            job.taken = True
        self._queue = [j for j in self._queue if j.untaken]
        return taken

    def _work(self, run: Runner) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                taken = self._take()
                if self._queue:
                    self._cond.notify()  # more work: wake another idle stream
            started = time.perf_counter()
            try:
                result: np.ndarray | None = run([job.payloads[i] for job, i in taken])
                error: BaseException | None = None
            except Exception as exc:  # noqa: BLE001  # fail this batch's requests, keep serving
                result, error = None, exc
            self._finish(taken, result, error, time.perf_counter() - started)

    def _finish(
        self, taken: list[tuple[BatchJob, int]], result: np.ndarray | None, error: BaseException | None, busy: float
    ) -> None:
        finished: list[BatchJob] = []
        failed: list[BatchJob] = []
        width = max(job.lengths[i] for job, i in taken)
        with self._cond:
            self.batches += 1
            self.busy_s += busy
            self.rows += len(taken)
            self.tokens += sum(job.lengths[i] for job, i in taken)
            self.padded_tokens += width * len(taken)
            self.batches_by_requests[len({id(j) for j, _ in taken})] += 1
            for k, (job, i) in enumerate(taken):
                if job.cancelled or job.future.done():
                    continue
                if result is None:
                    job.cancelled = True  # its other rows are not worth computing
                    if job in self._queue:
                        self._queue.remove(job)
                    failed.append(job)
                    continue
                if job.out is None:
                    job.out = np.empty((len(job.lengths), result.shape[1]), dtype=np.float32)
                job.out[i] = result[k]
                job.done += 1
                if job.done == len(job.lengths):
                    finished.append(job)
        if self._on_batch is not None:
            self._on_batch(len(taken), width * len(taken))
        for job in finished:
            assert job.out is not None
            job.resolve(job.out)
        for job in failed:
            assert error is not None
            job.resolve(error)
