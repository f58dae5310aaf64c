"""Phase 4: the packed engine on one GPU, as two replicas and split over two GPUs (its
contestants, request counts and the figures taken out of each contestant's gateway phase).
"""

from __future__ import annotations

from typing import Any

# The 4B/8B shapes run ~5-10x slower per document: fewer requests keep a contestant near a minute.
LARGE_REQUESTS = {("d100", 1): 24, ("d100", 32): 96}


def two_gpu_contestants(small: bool) -> list[tuple[str, dict[str, Any]]]:
    """The two-GPU phase's packed configurations: one device, two replicas, one model split over two."""
    d0, d1 = ("cpu", "cpu") if small else ("cuda:0", "cuda:1")
    return [
        ("packed-1gpu", {"devices": [d0]}),
        ("packed-2gpu", {"devices": [d0, d1]}),  # a whole replica per device, one queue
        ("packed-split", {"devices": [d0, d1], "split": "pipeline"}),
    ]  # layers halved, one step per stage


TWO_GPU_LEVELS = {"d100": (1, 32)}


def two_gpu_row(one: dict[str, Any], label: str) -> dict[str, Any]:
    """A contestant's idle latency and 32-client throughput out of its gateway phase."""
    by_c = {s["concurrency"]: s for s in one["http"][label]["d100"]["summaries"]}
    idle, load = by_c.get(1), by_c.get(32)
    return {
        "start_s": one["start_s"],
        "gpu_mib": one.get("gpu_mib"),
        "idle_p50_ms": idle["latency_ms"]["p50"] if idle else None,
        "idle_p99_ms": idle["latency_ms"]["p99"] if idle else None,
        "docs_per_s": load["docs_per_s"] if load else None,
        "errors": sum(sum(s["errors"].values()) for s in by_c.values()),
        "split": (one.get("engine_stats") or {}).get("split"),
    }


def two_gpu_ratios(two: dict[str, Any]) -> dict[str, float]:
    """Against one GPU: throughput of two replicas (``speedup``, the issue's target) and of the split;
    the split's idle latency (a pipeline adds no parallelism to one request: ~1.0 expected)."""
    one, rep, split = (two.get(k) or {} for k in ("packed-1gpu", "packed-2gpu", "packed-split"))
    out: dict[str, float] = {}
    if one.get("docs_per_s") and rep.get("docs_per_s"):
        out["speedup"] = rep["docs_per_s"] / one["docs_per_s"]
    if one.get("docs_per_s") and split.get("docs_per_s"):
        out["split_speedup"] = split["docs_per_s"] / one["docs_per_s"]
    if one.get("idle_p50_ms") and split.get("idle_p50_ms"):
        out["split_idle_p50_ratio"] = split["idle_p50_ms"] / one["idle_p50_ms"]
    return out
