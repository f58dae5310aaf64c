"""`rerank-gateway bench` as the docs and its own ``--help`` show it.

Every bench command quoted in the README, the docs pages and the ``--help`` examples parses with
the real parser and passes the checks made before a run (URL, model); and a Cohere v2 URL
without ``--model`` is refused in one line before any request is sent (each would be a 422:
``model`` is required on ``/v2/rerank``).
"""

from __future__ import annotations

import argparse
import shlex
import socket
import subprocess
import sys
import threading

import pytest

from gateway.bench.command import _EXAMPLES, _endpoint_url, _model_required, add_parser
from tests.conftest import ROOT
from tests.test_readme import commands

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _documented() -> list[str]:
    found = [c for page in PAGES for c in commands(page.read_text()) if c.startswith("rerank-gateway bench ")]
    found += [
        " ".join(c.split()) for c in commands("```bash\n" + _EXAMPLES + "```") if c.startswith("rerank-gateway bench ")
    ]
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rerank-gateway")
    add_parser(parser.add_subparsers(dest="command"))
    return parser


def test_the_docs_quote_bench_commands():
    assert len(_documented()) >= 5


@pytest.mark.parametrize("command", _documented())
def test_documented_bench_command_passes_the_checks_before_a_run(command: str):
    args = _parser().parse_args(shlex.split(command.replace("$LITELLM_MASTER_KEY", "sk-x"), comments=True)[1:])
    _model_required(_endpoint_url(args.url), args.model, "--model")
    if args.compare:
        _model_required(_endpoint_url(args.compare), args.compare_model or args.model, "--compare-model")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:{port}", "http://127.0.0.1:{port}/v2/rerank", "http://127.0.0.1:{port}/v1/v2/rerank/"]
)
def test_v2_url_without_model_is_refused_before_any_request(tmp_path, url: str):
    accepted: list[object] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        stop = threading.Event()

        def count() -> None:  # a connection would mean a request was about to be sent
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                accepted.append(conn)
                conn.close()

        thread = threading.Thread(target=count)
        thread.start()
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gateway",
                    "bench",
                    url.format(port=listener.getsockname()[1]),
                    "--requests",
                    "3",
                    "--warmup",
                    "0",
                    "--no-progress",
                    "--out",
                    str(tmp_path / "out"),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            stop.set()
            thread.join(timeout=5)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "requires a model in every request: add --model NAME" in line
    assert not accepted, "bench connected to the endpoint before refusing"
    assert "matplotlib" not in proc.stderr.lower()


def test_compare_v2_url_without_any_model_is_refused(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "bench",
            "http://127.0.0.1:9/rerank",
            "--compare",
            "http://127.0.0.1:9/v2/rerank",
            "--requests",
            "3",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "add --compare-model" in proc.stderr, proc.stderr
