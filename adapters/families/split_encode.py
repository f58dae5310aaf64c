"""A request's documents through the Rust tokenizer, split across a few threads when there are many.

One ``encode_batch`` call is parallel only through the tokenizer's rayon pool: one thread per CPU
(16 on the H200 host), whose idle workers spin, and which ``tokenizers`` turns off for good in a
process forked after using it. On the H200 an idle d100 request spent a third of its latency and
all of its tail tokenizing (issue 41). Here the documents are cut into ``threads`` contiguous
runs of about equal characters, each one ``encode_batch`` call (the Rust work releases the GIL)
on a small pool of this tokenizer's own -- the calling thread encodes the first run itself --
and the ids are joined in document order. Each document is encoded alone either way (a batch
encodes its texts independently), so the ids are the same as one call's, which tests check on
every family's tokenizer.

``tokenize_threads`` (model config): 1 (the default) is one call, as before; ``"auto"`` is a
quarter of the CPUs this process may run on, at most 4 (the other cores stay for the event loop,
the device's launcher and rayon). On the H200's 16-CPU host the split did not pay: one d100
request's documents took 4.2 ms (p50) in one call, 4.5 on 4 threads and 4.7 on 8, and the idle
latency over HTTP was the same (report gpu-h200-2026-12-05), so it is off by default.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ("SPLIT_MIN_DOCUMENTS", "SplitEncoder", "resolve_tokenize_threads", "split_bounds")

# Fewer documents than this go in one call: a run of a few short texts costs less to encode than
# a hand-off to another thread. d100's overlap parts are 12, 33 and 55 documents: the first (what
# the device waits for) stays one call on the event loop, the two larger ones are split.
SPLIT_MIN_DOCUMENTS = 24
_MAX_AUTO_THREADS = 4


def resolve_tokenize_threads(setting: int | str) -> int:
    """Threads one request's documents are split across: the setting, or ``"auto"``'s share of the CPUs."""
    if setting != "auto":
        return max(1, int(setting))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(_MAX_AUTO_THREADS, cpus // 4))


def split_bounds(texts: Sequence[str], parts: int) -> list[int]:
    """Cut points of ``parts`` contiguous runs of about equal characters (tokenizing time follows
    length), every run non-empty: ``[0, ..., len(texts)]``."""
    parts = max(1, min(parts, len(texts)))
    ends = list(itertools.accumulate(map(len, texts)))
    total = ends[-1] if ends else 0
    bounds = [0]
    for k in range(1, parts):
        # After the first document whose end reaches k/parts of the characters; a document left for each run after.
        cut = bisect.bisect_left(ends, k * total / parts) + 1
        bounds.append(min(max(cut, bounds[-1] + 1), len(texts) - (parts - k)))
    bounds.append(len(texts))
    return bounds


class SplitEncoder:
    """``texts -> ids`` through ``encode_batch`` (``add_special_tokens=False``), split across ``threads``.

    The pool's threads are shared by the model's requests. A request finds as many free as it
    finds: with none (others are tokenizing: the model is loaded, its cores are busy anyway) it
    encodes in one call on its own thread, as before, rather than queue its runs behind theirs.
    """

    def __init__(self, encode_batch: Callable[..., Any], threads: int) -> None:
        self._encode_batch = encode_batch
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._busy = 0  # pool threads taken by requests' runs

    def _ids(self, texts: list[str]) -> list[list[int]]:
        return [enc.ids for enc in self._encode_batch(texts, add_special_tokens=False)]

    def _run(self, texts: list[str]) -> list[list[int]]:
        try:
            return self._ids(texts)
        finally:
            with self._lock:
                self._busy -= 1

    def _take(self) -> int:
        """Pool threads this request may use now (0: none free), and the pool made on first use."""
        with self._lock:
            free = self.threads - 1 - self._busy
            if free > 0:
                self._busy += free
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="tokenize")
            return max(free, 0)

    def __call__(self, texts: list[str]) -> list[list[int]]:
        if self.threads <= 1 or len(texts) < SPLIT_MIN_DOCUMENTS:
            return self._ids(texts)
        helpers = self._take()
        if not helpers:
            return self._ids(texts)
        assert self._pool is not None
        bounds = split_bounds(texts, helpers + 1)
        runs: list[Future[list[list[int]]]] = [
            self._pool.submit(self._run, texts[lo:hi]) for lo, hi in itertools.pairwise(bounds[1:])
        ]
        with self._lock:
            self._busy -= helpers - len(runs)  # fewer documents than threads: the rest given back
        try:
            out = self._ids(texts[: bounds[1]])
            for run in runs:  # in document order
                out.extend(run.result())
        finally:
            for run in runs:  # an error: the runs not started yet are dropped (their threads given back)
                if run.cancel():
                    with self._lock:
                        self._busy -= 1
        return out
