"""Each benchmark suite runs at a tiny size, so a kept suite cannot rot between its real runs.

The real runs take minutes to hours on their machines (docs/benchmarks.md#suites); here each one
runs its whole path (build, serve, measure, report) on the smallest workload it accepts, and the
report it writes must hold every contestant asked for. Figures are not checked: a tiny run's
numbers mean nothing. The GPU suite's pieces are tested without a GPU in tests/test_bench_twogpu.py
and tests/test_bench_failures.py, the reliability run's in tests/test_reliability.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

CPU_CONTESTANTS = ["gateway transformers (fp32)", "onnxruntime fp32 (batch 32)"]


def test_cpu_encoders_suite_runs_at_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "cpu"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.cpu_encoders",
            "--out",
            str(out),
            "--shapes",
            "minilm",
            "--contestants",
            ";".join(CPU_CONTESTANTS),
            "--rounds",
            "1",
            "--requests",
            "1",
            "--agree",
            "1",
            "--gate",
            "4x10",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads((out / "cpu_encoders.json").read_text())
    (shape,) = report["shapes"]
    text = json.dumps(shape)
    for name in CPU_CONTESTANTS:
        assert name in text, name
    assert "gateway transformers (fp32)" in (out / "cpu_encoders.md").read_text()
