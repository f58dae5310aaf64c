"""The ``failover`` section: what a fallback chain's failover costs under load.

A chain (``engine = "chain"``, docs/routing.md) over two pools, each one stub replica: the
primary is killed (SIGKILL) under closed-loop load, stays down, then comes back on its port.
Per phase (healthy, primary dead, after its restart): requests, errors, p50/p99 and which target
served. ``preferred_again_s``: from the primary accepting connections again to the first answer
it served, and ``all_primary_again_s`` to the start of the first second served by the primary
alone (its cooldown, then the probe's readmission). Every answer's ``x-rerank-target`` header
names the target; an answer without it, or a non-200, is an error.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import free_port, wait_http
from benchmarks.reliability.processes import Gateway, Proc

__all__ = ("failover",)

COOLDOWN_S = 2.0


def _stub(port: int, workdir: Path, name: str) -> Proc:
    proc = Proc([sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(port)], workdir / f"{name}.log")
    wait_http(f"http://127.0.0.1:{port}/health", proc.proc, 30)
    return proc


def _summary(rows: list[tuple[float, int, float, str]]) -> dict[str, Any]:
    lat = sorted(r[2] * 1e3 for r in rows if r[1] == 200)
    return {
        "requests": len(rows),
        "errors": sum(1 for r in rows if r[1] != 200),
        "p50_ms": round(statistics.median(lat), 2) if lat else None,
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None,
        "served_by": dict(Counter(r[3] for r in rows if r[1] == 200)),
    }


def failover(
    workdir: Path, clients: int, healthy_s: float = 5.0, down_s: float = 8.0, after_s: float = 15.0
) -> dict[str, Any]:
    ports = {"primary": free_port(), "fallback": free_port()}
    stubs = {name: _stub(port, workdir, name) for name, port in ports.items()}
    pool = 'engine = "pool"\nprotocol = "cohere"\ntimeout_s = 5\nread_timeout_s = 1\nconnect_timeout_s = 0.5\n'
    config = (
        '[logging]\nformat = "json"\n\n[[models]]\nname = "rerank"\nengine = "chain"\n'
        f'targets = ["primary", "fallback"]\naccepts = "replicas"\ncooldown_s = {COOLDOWN_S}\n\n'
        f'[[models]]\nname = "primary"\n{pool}urls = ["http://127.0.0.1:{ports["primary"]}"]\n\n'
        f'[[models]]\nname = "fallback"\n{pool}urls = ["http://127.0.0.1:{ports["fallback"]}"]\n'
    )
    gw = Gateway(config, workdir, "failover").ready()
    rows: list[tuple[float, int, float, str]] = []  # (t since start, status or -1, latency s, target)
    marks: dict[str, float] = {}
    total = healthy_s + down_s + after_s
    try:

        async def run() -> None:
            start = time.monotonic()

            async def client(n: int) -> None:
                body = {
                    "model": "rerank",
                    "query": f"query {n}",
                    "documents": [f"doc {n}-{j}" for j in range(20)],
                    "top_n": 5,
                }
                async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                    while time.monotonic() - start < total:
                        t0 = time.monotonic()
                        try:
                            r = await http.post("/v2/rerank", json=body)
                            status, target = r.status_code, r.headers.get("x-rerank-target", "")
                        except httpx.HTTPError:
                            status, target = -1, ""
                        rows.append(
                            (t0 - start, status if target or status != 200 else -2, time.monotonic() - t0, target)
                        )

            async def faults() -> None:
                await asyncio.sleep(healthy_s)
                marks["kill"] = time.monotonic() - start
                stubs["primary"].stop(signal.SIGKILL)
                await asyncio.sleep(down_s)
                stubs["primary"] = await asyncio.to_thread(_stub, ports["primary"], workdir, "primary-again")
                marks["back"] = time.monotonic() - start  # accepting connections again

            await asyncio.gather(*(client(n) for n in range(clients)), faults())

        asyncio.run(run())
        back = marks["back"]
        first_primary = min((r[0] + r[2] for r in rows if r[0] >= back and r[3] == "primary"), default=None)
        all_primary = None
        for second in range(int(back), int(total)):  # the first whole second served by the primary alone
            window = [r for r in rows if second <= r[0] < second + 1 and r[1] == 200]
            if window and all(r[3] == "primary" for r in window):
                all_primary = round(second - back, 2)
                break
        return {
            "clients": clients,
            "cooldown_s": COOLDOWN_S,
            "healthy": _summary([r for r in rows if r[0] < marks["kill"]]),
            "primary_dead": _summary([r for r in rows if marks["kill"] <= r[0] < back]),
            "first_second_after_kill": _summary([r for r in rows if marks["kill"] <= r[0] < marks["kill"] + 1]),
            "after_restart": _summary([r for r in rows if r[0] >= back]),
            "errors": sum(1 for r in rows if r[1] != 200),
            "preferred_again_s": round(first_primary - back, 3) if first_primary is not None else None,
            "all_primary_again_s": all_primary,
            "tracebacks_logged": gw.tracebacks(),
        }
    finally:
        gw.stop()
        for s in stubs.values():
            s.stop(signal.SIGKILL)
