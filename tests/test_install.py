"""The README's install commands work without this machine's pip configuration.

Each test runs pip as the README's commands do, with the user's and the site's pip configuration
ignored (``PIP_CONFIG_FILE`` set, every ``PIP_*`` variable dropped), in ``--dry-run`` mode:

- the CPU torch step resolves ``torch 2.13.0+cpu`` from PyTorch's index where the network
  reaches it, and fails within seconds, without retries, where it does not;
- on a machine whose pip configuration names a local wheel directory, the same step takes the
  wheel from there although PyTorch's index is unreachable, again within seconds;
- once that torch is installed, the extras resolve on plain PyPI without asking for another
  torch, and no CUDA wheel (``nvidia-*``) is pulled in.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
import zipfile
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_readme import serve_command, torch_step

X86_LINUX = sys.platform == "linux" and platform.machine() == "x86_64"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# Fail-fast bound: the step's own --timeout plus PyPI's answer; pip's default five retries with
# back-off would take far longer on an index that answers nothing.
FAST_S = 45.0


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def _reaches(host: str) -> bool:
    try:
        socket.create_connection((host, 443), timeout=5).close()
        return True
    except OSError:
        return False


def _pip(args: list[str], config: Path | None, tmp: Path) -> tuple[subprocess.CompletedProcess[str], float, dict]:
    """``pip ARGS --dry-run --report``, the machine's pip configuration ignored."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = str(config) if config else os.devnull
    report = tmp / "report.json"
    started = time.monotonic()
    proc = subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [sys.executable, "-m", "pip", *args, "--dry-run", "--report", str(report), "--disable-pip-version-check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - started
    return proc, took, json.loads(report.read_text()) if report.exists() else {}


def _torch_args(index: str = TORCH_INDEX) -> list[str]:
    argv = torch_step(serve_command())
    assert argv[:2] == [".venv/bin/pip", "install"]
    return [a.replace(TORCH_INDEX, index) for a in argv[1:]] + ["--ignore-installed"]


def _fake_torch_wheel(folder: Path) -> Path:
    """A wheel named and versioned as PyTorch's CPU build (contents irrelevant to a dry run)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "torch-2.13.0+cpu-py3-none-any.whl"
    info = "torch-2.13.0+cpu.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not X86_LINUX, reason="the CPU torch step applies to x86-64 Linux only"),
    pytest.mark.skipif(not _reaches("pypi.org"), reason="PyPI is not reachable from here"),
]


def test_torch_step_resolves_from_pytorch_or_fails_fast(tmp_path: Path):
    proc, took, report = _pip(_torch_args(), None, tmp_path)
    assert "Retrying" not in proc.stderr  # --retries 0: one request per page
    if _resolves("download.pytorch.org"):
        assert proc.returncode == 0, proc.stderr
        (item,) = report["install"]
        assert (item["metadata"]["name"], item["metadata"]["version"]) == ("torch", "2.13.0+cpu")
    else:
        assert proc.returncode != 0
        assert "No matching distribution found for torch==2.13.0+cpu" in proc.stderr
        assert took < FAST_S, f"an unreachable PyTorch index cost {took:.1f} s"


def test_torch_step_takes_a_local_wheel_when_pytorch_is_unreachable(tmp_path: Path):
    wheels = tmp_path / "wheels"
    _fake_torch_wheel(wheels)
    config = tmp_path / "pip.conf"  # a machine whose pip knows a local wheel directory
    config.write_text(f"[global]\nfind-links = {wheels}\n")
    # A name that never resolves (RFC 2606), whether or not this machine reaches PyTorch.
    proc, took, report = _pip(_torch_args("https://download.pytorch.invalid/whl/cpu"), config, tmp_path)
    assert proc.returncode == 0, proc.stderr
    (item,) = report["install"]
    assert item["metadata"]["version"] == "2.13.0+cpu"
    assert item["download_info"]["url"].startswith("file://")
    assert "Retrying" not in proc.stderr
    assert took < FAST_S, f"{took:.1f} s"


def test_extras_resolve_on_plain_pypi_once_the_cpu_torch_is_installed(tmp_path: Path):
    try:
        installed = version("torch")
    except PackageNotFoundError:
        pytest.skip("torch is not installed here")
    if not installed.endswith("+cpu"):
        pytest.skip(f"torch {installed} here, not the CPU build the README installs")
    proc, _, report = _pip(["install", "-e", ".[cpu,test]"], None, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {item["metadata"]["name"].lower() for item in report["install"]}
    assert "torch" not in names  # the installed CPU build satisfies the pins: nothing asks an index for torch
    assert not {n for n in names if n.startswith("nvidia-")}, names


def test_this_environment_has_no_cuda_wheels():
    """The test venv (the README's test command) is the CPU path: no nvidia-* distributions."""
    names = {(d.metadata["Name"] or "").lower() for d in distributions()}
    assert not {n for n in names if n.startswith("nvidia-")}
    if "torch" in names:
        assert version("torch").endswith("+cpu")
