"""The README's test command is exactly what CI runs."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def _commands(text: str) -> list[str]:
    return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]


def test_ci_runs_the_readme_test_command():
    readme = _commands((ROOT / "README.md").read_text())
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    test_cmd = next(line for line in ci if "pytest" in line and "pip install" in line)
    assert "redis-server" in test_cmd  # the Redis tests need the server, CI installs it through this line
    assert test_cmd in readme
    serve_cmd = next(line for line in readme if "rerank-gateway serve" in line)
    assert serve_cmd.startswith("python3 -m venv .venv && .venv/bin/pip install -e ")
