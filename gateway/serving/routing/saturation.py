"""How full a target is: its queue depth and expected wait, read from the engine itself.

Spill-over passes a target by while it is saturated. Measured, not guessed:

- queue depth: the engine's own ``queue_depth()`` (requests waiting for their first step:
  transformers, OpenVINO, packed); for engines with no queue in sight (upstreams, static) the
  requests this gateway has in flight on the model (``in_flight``), which is the most it can
  have queued there;
- expected wait: the engine's own ``expected_wait_s()`` (its queued work times its recent step
  times: transformers, packed); None for an engine that cannot say (an upstream's queue is not
  visible), so only ``spill_queue_depth`` can pass such a target by.
"""

from __future__ import annotations

from gateway.serving.model_state import ModelRuntimeState

__all__ = ("expected_wait_s", "queue_depth", "saturated")


def queue_depth(runtime: ModelRuntimeState) -> int:
    depth = getattr(runtime.engine, "queue_depth", None)
    if callable(depth):
        return int(depth())
    return runtime.in_flight


def expected_wait_s(runtime: ModelRuntimeState) -> float | None:
    wait = getattr(runtime.engine, "expected_wait_s", None)
    return float(wait()) if callable(wait) else None


def saturated(runtime: ModelRuntimeState, *, max_depth: int | None, max_wait_s: float | None) -> str | None:
    """Why ``runtime`` counts as saturated under these bounds (for the log), or None when it is not."""
    if max_depth is not None:
        depth = queue_depth(runtime)
        if depth >= max_depth:
            return f"queue {depth} >= {max_depth}"
    if max_wait_s is not None:
        wait = expected_wait_s(runtime)
        if wait is not None and wait > max_wait_s:
            return f"expected wait {wait:.3f}s > {max_wait_s:g}s"
    return None
