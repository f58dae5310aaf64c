"""The real processes the reliability sections run against: a gateway, stub upstreams, Redis.

Each is a child with its own log file under the run's work folder, stopped (TERM, then KILL) by
the section that started it.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import time
from pathlib import Path

import httpx
import psutil

from benchmarks.harness import ROOT, Proc, free_port, wait_http

__all__ = ("KEY", "ROOT", "Gateway", "Proc")

KEY = "rk-reliability-long-run-0123456789abcdef"


class Gateway(Proc):
    def __init__(self, config: str, workdir: Path, name: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = workdir / f"{name}.toml"
        path.write_text(config)
        super().__init__(
            [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(self.port)],
            workdir / f"{name}.log",
            env={"HF_HUB_OFFLINE": "1"},
        )

    def ready(self, timeout: float = 120) -> Gateway:
        wait_http(f"{self.url}/ready", self.proc, timeout)
        return self

    def rss_mb(self) -> float:
        with contextlib.suppress(psutil.Error):
            return psutil.Process(self.proc.pid).memory_info().rss / 2**20
        return float("nan")

    def statuses(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines():
            if line.startswith("rerank_requests_total{"):
                status = line.split('status="')[1].split('"')[0]
                out[status] = out.get(status, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def tracebacks(self) -> int:
        return self.log.read_text(errors="replace").count("Traceback")


def _auth_toml(rpm: int | None = None) -> str:
    from gateway.security.auth import hash_key

    limit = f"rpm = {rpm}\n" if rpm else ""
    return f'[[auth.keys]]\nid = "reliability"\nhash = "{hash_key(KEY)}"\nmodels = ["*"]\n{limit}\n'


def _redis(port: int, workdir: Path) -> Proc:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    proc = Proc(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        workdir / f"redis-{port}-{time.monotonic_ns()}.log",
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return proc
        time.sleep(0.05)
    raise RuntimeError("redis-server did not start")
