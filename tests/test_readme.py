"""The README's commands and samples are the real ones: CI runs its test command, its request
works against a gateway, and the walkthrough in docs/getting-started.md prints what it shows."""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)


def commands(text: str) -> list[str]:
    """Every shell command of the ```bash blocks, continuation lines joined, spaces collapsed."""
    out = []
    for block in _blocks(text, "bash"):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(" ".join(line.split()))
    return out


def serve_command() -> str:
    return next(c for c in commands(README.read_text()) if c.endswith("rerank-gateway serve"))


def test_command() -> str:
    return next(c for c in commands(README.read_text()) if "pytest" in c and "scripts/install.sh" in c)


test_command.__test__ = False  # a helper, not a test


def test_ci_runs_the_readme_test_command():
    ci = commands("```bash\n" + (ROOT / ".ci" / "run").read_text() + "```")
    ci_cmd = next(line for line in ci if "pytest" in line and "scripts/install.sh" in line)
    assert "redis-server" in ci_cmd  # the Redis tests need the server, CI installs it through this line
    assert ci_cmd == test_command()
    # The lint and the type check are part of it (after the tests: a finding never hides a failure).
    assert ci_cmd.endswith("&& .venv/bin/ruff check && .venv/bin/ruff format --check && .venv/bin/mypy")
    # tests/test_install.py checks the script itself (Python check, torch step, one-line failures).
    assert serve_command() == "scripts/install.sh && .venv/bin/rerank-gateway serve"


def test_getting_started_shows_the_readme_commands():
    docs = commands(GETTING_STARTED.read_text())
    assert serve_command() in docs and test_command() in docs


def test_readme_is_short_and_points_into_the_docs():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for page in ("getting-started", "api", "configuration", "benchmarks"):
        assert f"](docs/{page}.md" in text, page
    # The generated references are committed too (tests/test_docs.py keeps them current): linked.
    assert "](docs/reference/configuration.md)" in text and "](docs/reference/http.md)" in text
    for heading in ("## Install and start", "## Run the tests", "## One request", "## Where to go next"):
        assert heading in text


def _python_snippet(text: str) -> str:
    (snippet,) = _blocks(text, "python")
    return snippet


def test_readme_python_snippet_defines_every_name_it_uses():
    tree = ast.parse(_python_snippet(README.read_text()))
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert not used - defined, f"undefined in the README's snippet: {sorted(used - defined)}"


@pytest.mark.slow
def test_readme_request_and_snippet_work_against_a_gateway(gateway_server):
    """The curl body and the cohere snippet, sent to a real gateway process serving the README's
    model name (static engine: the scores are set, the wire is the real one)."""
    server = gateway_server(
        """
[[models]]
name = "qwen3-reranker-0.6b"
engine = "static"
score = 0.1
scores = { "Washington, D.C. is the capital of the United States." = 0.98 }
"""
    )
    (curl,) = [b for b in _blocks(README.read_text(), "bash") if "curl" in b and "/v2/rerank" in b]
    body = json.loads(re.search(r"-d '(.*?)'", curl, re.DOTALL).group(1))
    url = re.search(r"(http://127\.0\.0\.1:8000\S*)", curl).group(1).replace("http://127.0.0.1:8000", server.url)
    resp = httpx.post(url, json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    shown = json.loads(
        "".join(line.lstrip("#").strip() for line in curl.splitlines() if line.startswith("#")).replace("…", "x")
    )
    got = resp.json()
    assert [r["index"] for r in got["results"]] == [r["index"] for r in shown["results"]]
    assert got["meta"]["api_version"] == shown["meta"]["api_version"] and got["model"] == shown["model"]

    snippet = _python_snippet(README.read_text()).replace("http://127.0.0.1:8000", server.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "README.md", "exec"), {})  # noqa: S102 - the README's own snippet
    assert out.getvalue().split() == ["1", "0.98"]


# --- The walkthrough in docs/getting-started.md ------------------------------------------------


def _walkthrough() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) of the console block."""
    (block,) = _blocks(GETTING_STARTED.read_text(), "console")
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def _run_documented(command: str, tiny: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command.replace("/tmp/tiny-qwen3", str(tiny)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANK_")}
    while "=" in argv[0]:
        key, value = argv.pop(0).split("=", 1)
        env[key] = value
    if argv[0] == ".venv/bin/python":
        argv[0] = sys.executable
    elif argv[0] == ".venv/bin/rerank-gateway":
        argv[:1] = [sys.executable, "-m", "gateway"]
    return subprocess.run(argv, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def documented_tiny(tmp_path_factory: pytest.TempPathFactory):
    """The walkthrough's first command, run as shown."""
    tiny = tmp_path_factory.mktemp("walk") / "tiny-qwen3"
    command, shown = _walkthrough()[0]
    assert command.startswith(".venv/bin/python -m tests.tiny_qwen3 ")
    return tiny, shown, _run_documented(command, tiny)


@pytest.mark.slow
def test_tiny_qwen3_prints_only_its_line_and_writes_readable_files(documented_tiny):
    tiny, shown, proc = documented_tiny
    assert proc.returncode == 0, proc.stderr
    # Exactly the documented line: no progress bar, no blank lines, no warnings.
    assert proc.stdout.splitlines() == [line.replace("/tmp/tiny-qwen3", str(tiny)) for line in shown]
    assert proc.stderr == ""
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tiny.iterdir()}
    assert "model.safetensors" in modes
    assert set(modes.values()) == {0o666 & ~umask}, modes  # 0644 under the usual umask 022


@pytest.mark.slow
def test_check_config_sample_output_is_the_real_one(documented_tiny):
    tiny, _, built = documented_tiny
    assert built.returncode == 0, built.stderr
    command, shown = next((c, s) for c, s in _walkthrough() if c.endswith("check-config"))
    proc = _run_documented(command, tiny)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    real = (proc.stdout + proc.stderr).strip().splitlines()
    # The sample is the CPU install's (transformers); where vLLM is installed (the test venv) the
    # default engine is vllm-score, which the docs say too.
    from gateway.config.settings import default_engine_kind

    engine = default_engine_kind()
    expected = [
        line.replace("/tmp/tiny-qwen3", str(tiny)).replace("engine=transformers", f"engine={engine}") for line in shown
    ]
    assert real == expected, (
        "docs/getting-started.md's check-config sample is stale; the real output is:\n" + "\n".join(real)
    )


# --- Commands quoted in prose ------------------------------------------------------------------

DOC_PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_hf_download_lines_are_the_installed_clients():
    """Every `hf download …` the README and docs quote parses with the hub client the install
    brings (its old `huggingface-cli` is gone from recent releases: none may be quoted)."""
    quoted = []
    for page in DOC_PAGES:
        text = " ".join(page.read_text().split())  # a span may wrap across lines
        assert "huggingface-cli" not in text, page
        quoted += re.findall(r"`(hf download [^`]+)`", text)
    assert quoted, "the README tells how to fetch the checkpoint with `hf download`"
    hf = Path(sys.executable).parent / "hf"
    if not hf.exists():
        pytest.skip("huggingface_hub's `hf` is not installed here")
    for line in quoted:
        argv = shlex.split(line.replace("<id>", "Qwen/Qwen3-Reranker-0.6B"))
        help_text = subprocess.run(
            [str(hf), *argv[1:2], "--help"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
        for option in (a for a in argv if a.startswith("--")):
            assert option in help_text, (line, option)
