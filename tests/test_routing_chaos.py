"""Chaos through a chain: 32 clients for 33 s against a real gateway process whose chained model's
primary -- a separate upstream process behind a ``pool`` -- is killed, restarted, made slow and
made to answer 500, 503 and 429 in turns. No client may see a failed request, every answer's
scores must be those of the target its ``x-rerank-target`` header names, and once the primary is
healthy again it serves again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port, stop_process, wait_http_ok

PRIMARY_SCORE, FALLBACK_SCORE = 0.25, 0.75
SCORE_OF = {"primary": PRIMARY_SCORE, "fallback": FALLBACK_SCORE}
CLIENTS = 32
CHAOS_S = 33.0
# (what the primary does, for how long): each failure kind twice, with healthy spells between.
# Each spell lasts at least the chain's 2 s cooldown (and 4 read timeouts of a slow answer).
SCHEDULE = [
    ("ok", 2),
    ("kill", 3),
    ("ok", 2),
    ("slow", 3),
    ("500", 2),
    ("ok", 2),
    ("503", 2),
    ("429", 2),
    ("kill", 3),
    ("ok", 2),
    ("slow", 2),
    ("500", 2),
    ("429", 3),
    ("ok", 3),
]

CONFIG = """
[[models]]
name = "rerank"
engine = "chain"
targets = ["primary", "fallback"]
accepts = "other-models"
timeout_s = 20
cooldown_s = 2
max_cooldown_s = 8  # failing again right after each readmission doubles its cooldown: bounded for the recovery check

[[models]]
name = "primary"
engine = "pool"
protocol = "cohere"
urls = ["http://127.0.0.1:{port}"]
timeout_s = 3
read_timeout_s = 0.5
connect_timeout_s = 0.5
probe_timeout_s = 0.5

[[models]]
name = "fallback"
engine = "static"
score = 0.75
"""


class Primary:
    """The upstream process (tests.fake_cohere_upstream) on a fixed loopback port, killable and restartable."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = (tmp / "primary.log").open("wb")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fake_cohere_upstream",
                "--port",
                str(self.port),
                "--score",
                str(PRIMARY_SCORE),
            ],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_http_ok(f"{self.url}/health", self.proc, deadline=time.monotonic() + 30, what="primary upstream")

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)  # no goodbye: connections drop mid-request
        self.proc.wait(10)
        self.proc = None

    def mode(self, mode: str) -> None:
        httpx.post(f"{self.url}/control", json={"mode": mode, "delay_s": 2.0}, timeout=5).raise_for_status()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self._log.close()


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[Primary]:
    server = Primary(tmp_path)
    server.start()
    yield server
    server.stop()


class Clients:
    """``CLIENTS`` threads posting rerank requests until stopped; every outcome is kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.served: Counter[str] = Counter()
        self.failures: list[str] = []
        self.mismatches: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def _run(self, i: int) -> None:
        body = {"model": "rerank", "query": f"client {i}", "documents": [f"doc {k} of {i}" for k in range(5)]}
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    response = client.post(f"{self.url}/v2/rerank", json=body)
                except httpx.HTTPError as exc:
                    with self.lock:
                        self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                with self.lock:
                    if response.status_code != 200:
                        self.failures.append(f"{response.status_code}: {response.text[:200]}")
                        continue
                    target = response.headers.get("x-rerank-target", "")
                    scores = {r["relevance_score"] for r in response.json()["results"]}
                    if target not in SCORE_OF or scores != {SCORE_OF[target]}:
                        self.mismatches.append(f"{target}: {sorted(scores)}")
                    self.served[target] += 1


@pytest.mark.slow
def test_zero_failed_requests_while_the_primary_is_killed_restarted_slow_and_failing(gateway_server, primary):
    gateway = gateway_server(CONFIG.format(port=primary.port))
    clients = Clients(gateway.url)
    for thread in clients.threads:
        thread.start()
    try:
        started = time.monotonic()
        for mode, seconds in SCHEDULE:
            if mode == "kill":
                primary.kill()
            elif primary.proc is None:
                primary.start()  # restarted on the same port
            if mode != "kill":
                primary.mode(mode)
            time.sleep(seconds)
        assert time.monotonic() - started >= CHAOS_S
        # Healthy again: within a few cooldowns the chain prefers the primary again.
        if primary.proc is None:
            primary.start()
        primary.mode("ok")
        before = clients.served["primary"]
        deadline = time.monotonic() + 30
        while clients.served["primary"] < before + 100 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        clients.stop.set()
        for thread in clients.threads:
            thread.join(60)
    assert not clients.failures, (len(clients.failures), clients.failures[:5])
    assert not clients.mismatches, clients.mismatches[:5]
    assert clients.served["primary"] >= before + 100, clients.served
    assert clients.served["fallback"] > 0, clients.served
    log = gateway.output()
    assert "target_ejected" in log and "target_readmitted" in log
