"""Every module the benchmark suites start by name (``[sys.executable, "-m", "benchmarks.X", ...]``,
a child process) exists: a module moved between suites must take its callers along."""

from __future__ import annotations

import ast
import importlib.util
import re

from tests.conftest import ROOT

_NAME = re.compile(r"benchmarks(\.[a-z_0-9]+)+")


def test_every_benchmarks_module_started_by_name_exists() -> None:
    named: dict[str, set[str]] = {}
    for path in [*sorted((ROOT / "benchmarks").rglob("*.py")), *sorted((ROOT / "tests").glob("test_bench*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAME.fullmatch(node.value):
                named.setdefault(node.value, set()).add(str(path.relative_to(ROOT)))
    assert "benchmarks.stub_upstream" in named  # the reliability and passthrough suites' upstream
    missing = {n: sorted(p) for n, p in named.items() if importlib.util.find_spec(n) is None}
    assert not missing, missing
