"""benchmarks/gpu_suite/encoders.py: the forward probe's MFU must count the FLOPs of the step it timed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_suite import encoders as ge
from benchmarks.gpu_suite.encoder_shapes import flops_per_request


def test_forward_probe_mfu_uses_the_timed_steps_flops(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # 8 requests of different sizes, as pair_lengths gives them; the probe times lens[0] (x1) and lens[:4] (x4).
    lens = [[100 + 20 * r] * 100 for r in range(8)]
    rate = 100.0  # TFLOP/s
    ms = {"x1": 10.0, "x4": 40.0}

    def fake_probe(model_dir: Path, device: str, lens_: list[list[int]], timeout: float) -> dict[str, Any]:
        return {
            "x1": {"tokens": sum(lens_[0]), "ms_median": ms["x1"]},
            "x4": {"tokens": sum(map(sum, lens_[:4])), "ms_median": ms["x4"]},
        }

    monkeypatch.setattr(
        ge,
        "build",
        lambda out, cfg, device: {
            "square_8192_tflops": rate,
            "model_gemms_tflops": rate,
            "model_gemms_each": {},
            "device": "fake",
        },
    )
    monkeypatch.setattr(ge, "pair_lengths", lambda model_dir, cfg, requests=8: lens)
    monkeypatch.setattr(ge, "forward_probe", fake_probe)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "gpu_encoders",
            "--tiny",
            "--forward-only",
            "--budget",
            "1000",
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "work"),
        ],
    )
    ge.main()
    fwd = json.loads((tmp_path / "out" / "encoders_results.json").read_text())["forward_probe"]
    cfg = ge.TINY_CONFIG
    want_x1 = flops_per_request(cfg, lens[0]) / (ms["x1"] / 1e3) / (rate * 1e12)
    want_x4 = sum(flops_per_request(cfg, x) for x in lens[:4]) / (ms["x4"] / 1e3) / (rate * 1e12)
    assert fwd["x1"]["mfu"] == pytest.approx(want_x1, rel=1e-9)
    assert fwd["x4"]["mfu"] == pytest.approx(want_x4, rel=1e-9)
