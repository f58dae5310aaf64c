"""``python -m benchmarks.gpu_suite host`` (the host's share of an idle d100 request) runs at a tiny size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_host_profile_runs_every_phase_for_each_variant(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu_suite", "host", "--tiny", "--work", str(tmp_path), "--requests", "3"]
    proc = subprocess.run(
        [*cmd, "--threads", "1,2", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert set(figures) == {"1", "2"}
    phases = {"decode", "texts", "shared", "rust", "ids", "job", "loop", "part1", "pack", "scores", "rank", "encode"}
    assert set(figures["1"]) == phases and set(figures["2"]) == phases
    assert all(v["p50"] <= v["p99"] for f in figures.values() for v in f.values())
    assert "host path of one d100 request" in proc.stdout
