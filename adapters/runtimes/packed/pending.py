"""One request waiting in the packed scheduler (``scheduler.PackedScheduler``): its prompts'
parts, how far steps have taken and scored it, and the future its scores resolve.

Apart from the scheduler because nothing here is about filling or running steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from adapters.runtimes.futures import resolve_from_thread

__all__ = ("PendingRequest",)


class PendingRequest:
    """One ``score`` call: its prompts are ``shared + item + suffix`` (assembled by the worker).

    ``segment``: where token type 1 starts in every prompt (``len(shared)`` for a BERT pair), or None.
    """

    __slots__ = (
        "_loop",
        "cancelled",
        "done",
        "eager",
        "future",
        "items",
        "next",
        "queued_at",
        "scores",
        "segment",
        "shared",
        "started_at",
        "suffix",
        "tokens_left",
    )

    def __init__(
        self,
        shared: Sequence[int],
        items: Sequence[Sequence[int]],
        suffix: Sequence[int],
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[list[Any]],
        segment: int | None = None,
        eager: bool = False,
    ) -> None:
        self.shared, self.items, self.suffix, self.segment = shared, items, suffix, segment
        self.eager = eager  # its steps are launched eagerly (no CUDA graph): see ``submit``
        self.scores: list[Any] = [0.0] * len(items)
        self.next = 0  # first item no step has taken yet
        self.done = 0  # items scored
        self.tokens_left = sum(len(i) for i in items) + (len(shared) + len(suffix)) * len(items)
        self.cancelled = False
        self.queued_at = time.perf_counter()
        self.started_at: float | None = None
        self._loop, self.future = loop, future

    def prompt_len(self, i: int) -> int:
        return len(self.shared) + len(self.items[i]) + len(self.suffix)

    def tail(self, i: int) -> list[int]:
        return [*self.items[i], *self.suffix]

    def resolve(self, result: list[Any] | BaseException) -> None:
        """Complete the future from a worker thread (the loop may be gone at shutdown)."""
        resolve_from_thread(self._loop, self.future, result)
