"""The issue's Qwen3-0.6B targets and their verdicts (``qwen3``'s summary judges its 0.6b levels).

A value is over every request of its level, failed ones included (``rerank-gateway bench``'s
summary). **met** needs zero failed requests, ≥ ``P99_MIN_SAMPLES`` requests for a p99, and the
value clear of the goal by more than its spread: the larger of the level's own 95 % bootstrap
interval and the run-to-run spread seen on the H200 (``SPREAD_FLOOR``).
"""

from __future__ import annotations

import math
from typing import Any

# The targets: (name, goal, workload, clients, measure, bound, higher is better)
TARGETS = [
    ("d100, one client at idle, p99", "≤ 60 ms", "d100", 1, "p99", 60, False),
    ("d100, one client at idle, p50", "≤ 50 ms", "d100", 1, "p50", 50, False),
    ("d100, 16 clients", "≥ 2,500 docs/s", "d100", 16, "docs_per_s", 2500, True),
    ("d100, 16 clients (stretch)", "≥ 3,000 docs/s", "d100", 16, "docs_per_s", 3000, True),
    ("d300, 16 clients", "≥ 1,300 docs/s", "d300", 16, "docs_per_s", 1300, True),
]
# The least spread a verdict must clear, relative to the value, from repeated runs of one set-up on
# the H200: idle p99 of d100 gave 24.3-26.3 ms (docs/benchmarks/gpu-h200-2026-12-02-d, -03: +-4 %),
# vllm-score's docs/s at 16 clients +-6 % in one run (gpu-h200-2026-12-01-c). A latency's own
# bootstrap interval (``latency_spread_ms`` of the bench summary) widens it where the level's
# samples say the percentile is less certain than that.
SPREAD_FLOOR = {"p50": 0.05, "p90": 0.05, "p99": 0.05, "docs_per_s": 0.06}
# Below this many requests p99 is an interpolation between the two or three largest: its value is
# one or two requests' and no verdict rests on it (a clear miss is still a miss).
P99_MIN_SAMPLES = 200


def _value(s: dict[str, Any], key: str) -> float:
    return float(s["docs_per_s"] if key == "docs_per_s" else s["latency_ms"][key])


def _spread(s: dict[str, Any], key: str, v: float) -> float:
    """Half-width of the band around ``v`` inside which a target is neither met nor missed."""
    floor = SPREAD_FLOOR.get(key, 0.05) * v
    lo, hi = (s.get("latency_spread_ms") or {}).get(key, (float("nan"), float("nan")))
    boot = 0.0 if math.isnan(lo) or math.isnan(hi) else max(v - lo, hi - v)  # no interval: the floor alone
    return max(floor, boot)


def judge(s: dict[str, Any], key: str, bound: float, higher: bool) -> str:
    """A target's verdict for one level's summary: "**met**" only with zero failed requests, enough
    samples for the percentile, and the value clear of the bound by more than its spread."""
    v = _value(s, key)
    failed = s.get("failed", s["requests"] - s["ok"])
    if math.isnan(v):  # nothing answered
        return "not met: no value"
    spread = _spread(s, key, v)
    beyond = (v - bound) if higher else (bound - v)  # > 0: on the good side of the bound
    rel = f"{abs(v - bound) / bound:.0%}"
    if beyond < -spread:
        return f"missed by {rel}" + (f" ({failed} failed requests)" if failed else "")
    if failed:
        errs = ", ".join(f"{k}: {n}" for k, n in s.get("errors", {}).items())
        return f"not met: {failed} of {s['requests']} requests failed ({errs})"
    if key == "p99" and s["requests"] < P99_MIN_SAMPLES:
        return (
            f"not judged: p99 of {s['requests']} requests rests on the slowest one or two (≥ {P99_MIN_SAMPLES} needed)"
        )
    if beyond <= spread:
        return f"within noise ({rel} from the goal, spread ±{spread / v:.0%})"
    return f"**met** ({rel} clear, spread ±{spread / v:.0%})"


def targets_table(levels: dict[str, dict[tuple[str, int], dict[str, Any]]]) -> list[str]:
    """The targets as Markdown lines: runtime -> (workload, clients) -> that level's bench summary."""
    kinds = list(levels)
    floors = ", ".join(f"{k} ±{v:.0%}" for k, v in SPREAD_FLOOR.items())
    lines = [
        (
            "Each value is over every request of its level, failed ones included. **met** needs zero failed "
            f"requests, ≥ {P99_MIN_SAMPLES} requests for a p99, and the value clear of the goal by more than its "
            "spread: the larger of the level's own 95 % bootstrap interval and the run-to-run spread seen before "
            f'({floors}); inside it the verdict is "within noise".'
        ),
        "",
        "| target | goal | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for name, goal, wl, c, key, bound, higher in TARGETS:
        cells = []
        for kind in kinds:
            s = levels[kind].get((wl, c))
            unit = " docs/s" if key == "docs_per_s" else " ms"
            cells.append("not run" if s is None else f"{_value(s, key):,.1f}{unit}: {judge(s, key, bound, higher)}")
        lines.append(f"| {name} | {goal} | " + " | ".join(cells) + " |")
    return lines
