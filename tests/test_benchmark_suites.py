"""Each benchmark suite runs at a tiny size, so a kept suite cannot rot between its real runs.

The real runs take minutes to hours on their machines (docs/benchmarks.md#suites); here each one
runs its whole path (build, serve, measure, report) on the smallest workload it accepts, and the
report it writes must hold every contestant asked for. Figures are not checked: a tiny run's
numbers mean nothing. The GPU suite runs on CPU (its tiny models); its targets are also tested
in tests/test_bench_failures.py, the reliability run's
pieces in tests/test_reliability.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

# sentence-transformers in a process of its own: the path the openvino / onnx backends take in
# the peers' venv (--peers-python), here in this environment, on torch.
PEER = "sentence-transformers torch (batch 32, own process)"
CPU_CONTESTANTS = ["gateway transformers (fp32)", "onnxruntime fp32 (batch 32)", PEER]


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
            "--baseline",
            PEER,
            "--busy",
            "1",
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
    assert not shape["skipped"], shape["skipped"]
    assert (shape["baseline"], shape["busy"]) == (PEER, 1)
    rows = {e["contestant"]: e for e in shape["table"]}
    assert rows[PEER]["vs_baseline"] == 1.0  # every ratio is taken against the baseline
    assert rows[PEER]["peer"]["class"]  # what the peer process said it runs
    assert "gateway transformers (fp32)" in (out / "cpu_encoders.md").read_text()


def _run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _litellm_venv() -> Path | None:
    """LiteLLM proxy's own venv, where one exists on this machine (it is not a dependency)."""
    for venv in (ROOT / "bench-out" / "litellm-venv", Path("/tmp/litellm-venv")):
        if (venv / "bin" / "litellm").exists():
            return venv
    return None


def test_passthrough_suite_runs_at_a_tiny_size(tmp_path: Path) -> None:
    """The routing report's mode (python client, a chain beside the plain gateway); LiteLLM when
    its venv is here. wrk is not installed on the CI box, so --client python."""
    venv = _litellm_venv()
    targets = ["gateway-1w", "gateway-chain-1w", *(["litellm"] if venv else [])]
    out = tmp_path / "pt"
    _run(
        [
            "benchmarks.passthrough_wrk",
            "--client",
            "python",
            "--chain",
            "--targets",
            ",".join(targets),
            "--clients",
            "1",
            "--rounds",
            "1",
            "--seconds",
            "0.5",
            "--litellm-venv",
            str(venv or tmp_path / "no-litellm"),
            "--out",
            str(out),
        ]
    )
    report = json.loads((out / "passthrough_wrk.json").read_text())
    assert report["client"] == "python"
    ran = {run["target"] for run in report["runs"]} if isinstance(report["runs"], list) else set(report["runs"])
    assert {"stub", *targets} <= ran, ran
    md = (out / "passthrough_wrk.md").read_text()
    for name in targets:
        assert f"| {name} | 1 |" in md, name


def test_reliability_suite_runs_at_a_tiny_size(tmp_path: Path) -> None:
    """The soak section end to end (a gateway process, the hostile pass before and after, the report)."""
    _run(["benchmarks.reliability", "--only", "soak", "--clients", "2", "--soak-s", "2", "--out", str(tmp_path)])
    (day,) = tmp_path.iterdir()
    soak = json.loads((day / "reliability.json").read_text())["soak"]
    assert "skipped" not in soak, soak
    assert soak["requests"] > 0 and soak["lost"] == 0
    assert soak["hostile_after"]["tried"] > 0 and soak["hostile_after"]["five_xx"] == 0
    assert "| soak |" in (day / "reliability.md").read_text()


def test_gpu_suite_subcommands_run_their_gateways_on_cpu(tmp_path: Path) -> None:
    """``encoders --tiny`` and ``qwen3 --smoke``: each runtime in a gateway process of its own
    (the shared harness), rerank-gateway bench as the client, the summary written."""
    enc = tmp_path / "enc"
    _run(
        ["benchmarks.gpu_suite", "encoders", "--tiny", "--runtimes", "packed", "--idle-requests", "2"]
        + ["--load-requests", "4", "--clients", "2", "--warmup", "1", "--warm-pass", "2"]
        + ["--out", str(enc), "--work", str(tmp_path / "encw")]
    )
    run = json.loads((enc / "encoders_results.json").read_text())["runs"]["packed"]
    assert "error" not in run, run.get("error")
    assert [r["clients"] for r in run["rows"]] == [1, 2]
    assert "| packed |" in (enc / "encoders_summary.md").read_text()
    qwen = tmp_path / "qwen3"
    _run(["benchmarks.gpu_suite", "qwen3", "--smoke", "--out", str(qwen), "--work", str(tmp_path / "qw")])
    runs = json.loads((qwen / "qwen3_results.json").read_text())["runs"]
    assert runs and all("error" not in r for r in runs.values()), runs
    md = (qwen / "qwen3_summary.md").read_text()
    assert "side by side" in md and "| d100, one client at idle, p50 | ≤ 50 ms | " in md
