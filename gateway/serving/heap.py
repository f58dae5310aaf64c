"""Keeping Python's cyclic garbage collector off the heap a loaded model leaves behind.

Importing torch and transformers and loading a model leave hundreds of thousands to millions of
long-lived objects (modules, tensors' Python wrappers, compiled graphs, tokenizer tables). None
of them is garbage, yet every full (generation 2) collection walks them all while holding the
GIL: the event loop and the engine's worker threads stop for as long as that takes
(report cpu-2026-12-01-hostlat: a serving gateway with a tiny packed or transformers model holds
~472k objects and a full collection took 285-640 ms on the shared 2-core box; frozen, 0.5 ms --
docs/benchmarks/cpu-2026-12-01-hostlat/; torch.compile's graphs on a GPU add more).
``gc.freeze()`` moves every object alive at that moment into a permanent generation no
collection scans; reference counting still frees them as usual, only cycles among them wait
for ``thaw``.

So, in the serving process (:func:`enable`): once at start and after each model has loaded,
collect what is garbage now (one pause, at load time rather than on a request) and freeze the
rest (:func:`settle`). Before an engine is stopped to be replaced (a restart) the heap is thawed
(:func:`thaw`): an engine's objects form cycles (a scheduler and its worker threads), which only
a collection can free, and frozen they would keep the old model's weights -- GPU memory
included -- alive for good.
"""

from __future__ import annotations

import gc
import time

import structlog

__all__ = ("enable", "settle", "thaw")

log = structlog.get_logger("gateway.heap")
# Set by the serving process (``gateway.launch.servers``): a process that embeds the app (the
# tests, a library user) keeps its collector as it is -- frozen objects that later become
# garbage cycles stay until exit, which only a process that is one gateway should accept.
_enabled = False


def enable() -> None:
    """This process serves one gateway: freeze the heap at start and after each model load."""
    global _enabled
    _enabled = True


def settle(reason: str) -> None:
    """Collect the garbage there is now, then freeze every surviving object (see the module doc)."""
    if not _enabled:
        return
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info(
        "heap_frozen",
        reason=reason,
        frozen_objects=gc.get_freeze_count(),
        collect_ms=round(1e3 * (time.perf_counter() - started), 1),
    )


def thaw() -> None:
    """Make the frozen objects collectable again (an engine is about to be replaced)."""
    gc.unfreeze()
