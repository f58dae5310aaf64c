"""The GPU suite's two-GPU phase without GPUs: its contestants are valid configurations, its rows
and ratios come out of a gateway phase's results, and the targets table says what was (not) run.

The phase itself runs end to end on CPU "devices" with
``python -m benchmarks.gpu_suite --small --phases twogpu`` (~50 s on 2 busy cores; not a test).
"""

from __future__ import annotations

import msgspec
import pytest

from benchmarks.gpu_suite import plan, report, two_gpu
from schemas.config import Settings


@pytest.mark.parametrize("small", [False, True])
def test_contestants_are_valid_packed_configurations(small):
    got = two_gpu.two_gpu_contestants(small)
    assert [label for label, _ in got] == ["packed-1gpu", "packed-2gpu", "packed-split"]
    models = [
        {"name": label, "engine": "packed", "path": "/m", **plan.GPU_ENGINES["packed"], **over} for label, over in got
    ]
    settings = msgspec.convert({"models": models}, Settings)
    one, rep, split = settings.models
    dev = "cpu" if small else "cuda"
    assert [d.split(":")[0] for d in rep.devices] == [dev, dev] and len(one.devices) == 1
    assert (one.split, rep.split, split.split) == ("none", "none", "pipeline") and split.devices == rep.devices


def _phase_out(label: str, idle_p50: float, docs_per_s: float, split: dict | None = None) -> dict:
    """What ``phase_gateway`` returns for the two-GPU levels (d100 at 1 and 32 clients)."""
    summaries = [
        {
            "concurrency": 1,
            "docs_per_s": 100 / idle_p50 * 1e3,
            "latency_ms": {"p50": idle_p50, "p99": idle_p50 * 1.1},
            "errors": {},
        },
        {"concurrency": 32, "docs_per_s": docs_per_s, "latency_ms": {"p50": 900.0, "p99": 990.0}, "errors": {"503": 2}},
    ]
    return {
        "start_s": 12.0,
        "gpu_mib": {"ready": [15500, 0]},
        "http": {label: {"d100": {"summaries": summaries}}},
        "engine_stats": {"split": split} if split else {},
    }


def test_rows_ratios_and_target_lines():
    stages = {
        "mode": "pipeline",
        "stages": [{"device": "cuda:0", "layers": [0, 18]}, {"device": "cuda:1", "layers": [18, 36]}],
    }
    two = {
        label: two_gpu.two_gpu_row(out, label)
        for label, out in [
            ("packed-1gpu", _phase_out("packed-1gpu", 420.0, 240.0)),
            ("packed-2gpu", _phase_out("packed-2gpu", 415.0, 468.0)),
            ("packed-split", _phase_out("packed-split", 441.0, 456.0, stages)),
        ]
    }
    assert two["packed-1gpu"] == {
        "start_s": 12.0,
        "gpu_mib": {"ready": [15500, 0]},
        "idle_p50_ms": 420.0,
        "idle_p99_ms": pytest.approx(462.0),
        "docs_per_s": 240.0,
        "errors": 2,
        "split": None,
    }
    assert two["packed-split"]["split"] == stages
    two.update(two_gpu.two_gpu_ratios(two))
    assert two["speedup"] == pytest.approx(1.95) and two["split_speedup"] == pytest.approx(1.9)
    assert two["split_idle_p50_ratio"] == pytest.approx(1.05)
    lines = report.two_gpu_target_lines(two)
    # Each contestant's 32-client level had two 503s: the speedup is reported, "met" refused.
    assert lines[0] == (
        "| two GPUs, d100, 32 clients (packed, two replicas) | ≥ 1.9× one GPU | 468 vs 240 docs/s = 1.95×: "
        "not met: 4 failed requests |"
    )
    assert lines[1] == (
        "| two GPUs, d100, 32 clients (packed, one model split in a pipeline) | reported | "
        "456 docs/s = 1.90× one GPU; idle p50 441.0 vs 420.0 ms = 1.05× |"
    )


def test_target_lines_when_a_contestant_is_missing():
    assert report.two_gpu_target_lines({}) == [
        "| two GPUs, d100, 32 clients | ≥ 1.9× one GPU | not run (no second GPU in this run) |"
    ]
    one = two_gpu.two_gpu_row(_phase_out("packed-1gpu", 420.0, 240.0), "packed-1gpu")
    rep = two_gpu.two_gpu_row(_phase_out("packed-2gpu", 415.0, 400.0), "packed-2gpu")
    two = {"packed-1gpu": one, "packed-2gpu": rep}
    two.update(two_gpu.two_gpu_ratios(two))  # the split failed to start: no ratio, no line, no KeyError
    assert "split_speedup" not in two
    lines = report.two_gpu_target_lines(two)
    assert len(lines) == 1 and lines[0].endswith("400 vs 240 docs/s = 1.67×: missed by 12% |")
