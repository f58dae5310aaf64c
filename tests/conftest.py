"""Shared fixtures: the tiny Qwen3 checkpoint, in-process app clients, real server processes."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.tiny_llm_rerankers import build_tiny_gemma, build_tiny_qwen2
from tests.tiny_qwen3 import build_tiny_qwen3

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def _in_process_loggers_not_cached() -> Iterator[None]:
    """An in-process app (``create_app`` configures logging) caches every module's structlog
    logger bound to the processors of that moment, for the rest of the pytest process: a later
    test's ``structlog.testing.capture_logs()`` then saw no event. Which tests failed depended on
    the order of the files (``tests/test_routing_chain.py`` before ``tests/test_pool_stats.py``
    failed 4). Server processes keep the default (cached)."""
    import gateway.app
    from gateway.observability.logging import configure_logging

    with pytest.MonkeyPatch.context() as m:
        m.setattr(gateway.app, "configure_logging", functools.partial(configure_logging, cache=False))
        yield


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 checkpoint + tokenizer, built once per test run."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GemmaForCausalLM (bge-reranker-v2-gemma's architecture), built once per run."""
    return build_tiny_gemma(tmp_path_factory.mktemp("tiny-gemma"))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2ForCausalLM (mxbai-rerank-v2's architecture), built once per run."""
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http_ok(
    url: str,
    proc: subprocess.Popen[bytes],
    *,
    deadline: float,
    what: str,
    log: Callable[[], str] = lambda: "",
    interval: float = 0.2,
) -> None:
    """Poll ``url`` until it answers 200; fail at once if ``proc`` exits, or at ``deadline``."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready in time:\n{log()}")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate, then kill if it does not exit within 30 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class ServerProcess:
    """A real ``rerank-gateway serve`` process on loopback, with its captured output."""

    def __init__(self, config_text: str, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / f"gateway-{self.port}.toml"
        self.config.write_text(config_text)
        self.log_path = tmp / f"gateway-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(self.config), "--port", str(self.port)],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        wait_http_ok(
            f"{self.url}/ready", self.proc, deadline=time.monotonic() + timeout, what="gateway", log=self.output
        )

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@pytest.fixture
def gateway_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start real gateway processes from TOML text; all are stopped after the test."""
    started: list[ServerProcess] = []

    def start(config_text: str, *, env: dict[str, str] | None = None, wait: bool = True) -> ServerProcess:
        server = ServerProcess(config_text, tmp_path, env)
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()
