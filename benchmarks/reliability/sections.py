"""The reliability sections: each starts its processes, injects its fault under load and
returns its figures (see the package's docstring for what each one does).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.harness import free_port, wait_http
from benchmarks.reliability.hostile import hostile_pass as hostile_pass_on
from benchmarks.reliability.load import Load, under_load
from benchmarks.reliability.processes import KEY, Gateway, Proc, _auth_toml, _redis

# The order in which the sections run; ``--only`` picks a subset.
SECTIONS = ("soak", "upstream", "failover", "redis", "sigterm", "engine")


def hostile_pass(gw: Gateway) -> dict[str, Any]:
    limits = {"max_body_bytes": 20 * 2**20, "max_documents": 10_000}  # the gateway's defaults
    out = hostile_pass_on(gw.port, key=KEY, **limits, timeout=60)
    return {**out, "healthy_after": httpx.get(f"{gw.url}/ready", timeout=10).status_code == 200}


def soak(workdir: Path, clients: int, seconds: float) -> dict[str, Any]:
    config = f'[logging]\nformat = "json"\n\n{_auth_toml()}[[models]]\nname = "static"\nengine = "static"\n'
    gw = Gateway(config, workdir, "soak").ready()
    try:
        before = hostile_pass(gw)
        rss: list[tuple[float, float]] = []

        async def sampler(load: Load) -> None:
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds + 1:
                rss.append((round(time.monotonic() - t0, 1), round(gw.rss_mb(), 1)))
                await asyncio.sleep(1.0)

        load = under_load(gw.url, clients, seconds, sampler, model="static")
        after = hostile_pass(gw)
        summary = load.summary()
        return {
            "clients": clients,
            "seconds": seconds,
            "client_minutes": round(clients * seconds / 60, 1),
            **summary,
            "req_per_s": round(summary["requests"] / seconds, 1),
            "rss_mb_start": rss[0][1] if rss else None,
            "rss_mb_end": rss[-1][1] if rss else None,
            "rss_mb_max": max(r for _, r in rss) if rss else None,
            "rss_timeline": rss[:: max(1, len(rss) // 20)],
            "hostile_before": before,
            "hostile_after": after,
            "server_5xx_counted": sum(v for k, v in gw.statuses().items() if k.startswith("5")),
            "tracebacks_logged": gw.tracebacks(),
        }
    finally:
        gw.stop()


def upstream(workdir: Path, clients: int) -> dict[str, Any]:
    ports = [free_port(), free_port()]
    stubs = [
        Proc([sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(p)], workdir / f"stub-{p}.log")
        for p in ports
    ]
    for p, s in zip(ports, stubs, strict=True):
        wait_http(f"http://127.0.0.1:{p}/health", s.proc, 30)
    urls = ", ".join(f'"http://127.0.0.1:{p}"' for p in ports)
    config = (
        f'[logging]\nformat = "json"\n\n[[models]]\nname = "pool"\nengine = "pool"\nprotocol = "cohere"\n'
        f"urls = [{urls}]\ntimeout_s = 10\neject_after_failures = 2\ncooldown_s = 2.0\n"
    )
    gw = Gateway(config, workdir, "pool").ready()
    slow: list[Proc] = []
    try:

        async def faults(load: Load) -> None:
            await asyncio.sleep(5)
            load.mark("kill")
            stubs[1].stop(signal.SIGKILL)
            await asyncio.sleep(7)
            load.mark("slow")
            stub = [sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(ports[1]), "--delay-s", "1"]
            slow.append(Proc(stub, workdir / "stub-slow.log"))

        load = under_load(gw.url, clients, 25, faults, model="pool", key=None)
        marks = load.marks
        return {
            "clients": clients,
            "before_kill": load.summary(0, marks["kill"]),
            "replica_killed": load.summary(marks["kill"], marks["slow"]),
            "replica_slow": load.summary(marks["slow"], 25),
            "recovery_s_after_kill": load.first_ok_after(marks["kill"]),
            "tracebacks_logged": gw.tracebacks(),
        }
    finally:
        gw.stop()
        for s in [*stubs, *slow]:
            s.stop(signal.SIGKILL)


def redis_faults(workdir: Path, clients: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("closed", "open"):
        port = free_port()
        redis = _redis(port, workdir)
        config = (
            f'[logging]\nformat = "json"\n\n[limits]\nredis_url = "redis://127.0.0.1:{port}/0"\n'
            f'redis_failure = "{mode}"\n\n{_auth_toml(rpm=10**6)}[[models]]\nname = "static"\nengine = "static"\n'
        )
        gw = Gateway(config, workdir, f"redis-{mode}").ready()
        try:

            async def faults(load: Load) -> None:
                nonlocal redis
                await asyncio.sleep(3)
                load.mark("kill")
                redis.stop(signal.SIGKILL)
                await asyncio.sleep(5)
                redis = await asyncio.to_thread(_redis, port, workdir)  # noqa: B023
                load.mark("restart")

            load = under_load(gw.url, clients, 15, faults, model="static")
            marks = load.marks
            down = load.summary(marks["kill"], marks["restart"])
            out[mode] = {
                "before": load.summary(0, marks["kill"]),
                "redis_down": down,
                "after_restart": load.summary(marks["restart"] + 2.0),
                "recovery_s_after_restart": (
                    load.first_ok_after(marks["restart"]) if mode == "closed" else load.first_ok_after(marks["kill"])
                ),
                "five_xx_other_than_503": sum(
                    v for k, v in down["statuses"].items() if k.startswith("5") and k != "503"
                ),
                "tracebacks_logged": gw.tracebacks(),
            }
        finally:
            gw.stop()
            redis.stop(signal.SIGKILL)
    return out


def sigterm(workdir: Path, in_flight: int = 16) -> dict[str, Any]:
    config = '[logging]\nformat = "json"\n\n[[models]]\nname = "slow"\nengine = "static"\ndelay_s = 2.0\n'
    gw = Gateway(config, workdir, "sigterm").ready()

    async def run() -> tuple[list[int], float]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            body = {"model": "slow", "query": "q", "documents": ["a", "b"]}

            async def one() -> int:
                try:
                    return (await http.post("/v2/rerank", json=body)).status_code
                except httpx.HTTPError:
                    return -1

            tasks = [asyncio.create_task(one()) for _ in range(in_flight)]
            # Signal once the gateway has every request (a connection whose request has not
            # arrived yet is idle, and a draining server closes idle connections): on a loaded
            # box the client may take longer than the requests' 2 s to send them all.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                models = (await http.get("/ready")).json()["models"]
                if sum(m["in_flight"] for m in models) >= in_flight:
                    break
                await asyncio.sleep(0.05)
            took = await asyncio.to_thread(gw.stop, signal.SIGTERM)
            return list(await asyncio.gather(*tasks)), took

    statuses, took = asyncio.run(run())
    return {
        "in_flight": in_flight,
        "answered_200": statuses.count(200),
        "statuses": dict(Counter(map(str, statuses))),
        "exit_s": round(took, 2),
        "exit_code": gw.proc.returncode,
    }


@contextlib.contextmanager
def _vllm_lock() -> Iterator[None]:
    with open("/tmp/vllm.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def engine_kill(workdir: Path, clients: int, window_s: float, logs: Path | None = None) -> dict[str, Any]:
    """Kill vLLM's engine-core process (and its worker) under load; keep loading until the
    first 200 after the kill plus ``_AFTER_RECOVERY_S``, or ``window_s`` at most.

    vLLM on a loaded 2-core CPU takes minutes to start (155 s seen for the first start), so the
    window must exceed a start: a shorter one reports "no recovery" for a restart in progress.
    """
    from tests.tiny_qwen3 import build_tiny_qwen3

    tiny = build_tiny_qwen3(workdir / "tiny-qwen3")
    config = (
        f'[logging]\nformat = "json"\n\n[[models]]\nname = "vs"\nengine = "vllm-score"\npath = "{tiny}"\n'
        "max_length = 256\nmax_query_tokens = 32\ntimeout_s = 60\nenforce_eager = true\ngpu_memory_utilization = 0.1\n"
    )
    with _vllm_lock():
        started = time.monotonic()
        gw = Gateway(config, workdir, "vllm").ready(timeout=480)
        first_start_s = round(time.monotonic() - started, 1)
        load = Load()
        marks = load.marks
        try:
            # The engine-core process only: its executor's VLLM::Worker child is left to notice.
            cores = [
                p
                for p in psutil.Process(gw.proc.pid).children(recursive=True)
                if "EngineCore" in " ".join([p.name(), *p.cmdline()])
            ]

            def recovered_a_while_ago() -> bool:
                if "kill" not in marks:
                    return False
                ok = load.first_ok_after(marks["kill"])
                return ok is not None and time.monotonic() - load.start > marks["kill"] + ok + _AFTER_RECOVERY_S

            async def faults(load: Load) -> None:
                await asyncio.sleep(3)
                load.mark("kill")
                for core in cores:
                    with contextlib.suppress(psutil.Error):
                        core.send_signal(signal.SIGKILL)

            kw = {"model": "vs", "backoff_503": 0.5, "until": recovered_a_while_ago}
            under_load(gw.url, clients, window_s, faults, load, **kw)
            restarted = load.first_ok_after(marks["kill"])
            after = marks["kill"] + (restarted if restarted is not None else window_s)
            return {
                "clients": clients,
                "window_s": window_s,
                "first_start_s": first_start_s,
                "engine_cores_killed": len(cores),
                "before_kill": load.summary(0, marks["kill"]),
                "after_kill": load.summary(marks["kill"]),
                "until_recovery": load.summary(marks["kill"], after),
                "after_recovery": load.summary(after) if restarted is not None else None,
                "recovery_s_after_kill": restarted,
                "gateway_events": _events(gw.log, ("engine_died", "engine_restart_failed", "engine_restarted")),
                "tracebacks_logged": gw.tracebacks(),
            }
        finally:
            gw.stop()
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(gw.log, logs / "engine-gateway.log")


# Seconds of load kept after the first 200 following a fault: the engine must keep serving.
_AFTER_RECOVERY_S = 15.0


def _events(log: Path, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The gateway's JSON log lines whose event is one of ``names`` (error text cut)."""
    out: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if rec.get("event") in names:
                out.append({k: (v[:300] if isinstance(v, str) else v) for k, v in rec.items()})
    return out
