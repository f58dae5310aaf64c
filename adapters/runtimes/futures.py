"""Completing an event loop's future from a worker thread (the packed scheduler, the CPU batcher).

Both run model steps on threads of their own and hand each request its result on the loop that
awaits it; kept in one place so the two agree on shutdown and double completion.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ("resolve_from_thread",)


def resolve_from_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any) -> None:
    """Set ``result`` (an exception: raised to the awaiting task) on ``future`` from another thread.

    A loop already closed at shutdown is not an error: nobody awaits the future any more.
    """
    try:
        loop.call_soon_threadsafe(_complete, future, result)
    except RuntimeError:
        pass


def _complete(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():  # cancelled meanwhile (client gone, timeout): the result is dropped
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
