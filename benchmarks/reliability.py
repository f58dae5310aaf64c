"""Reliability suite, long part: a soak and fault injection against real processes.

    python -m benchmarks.reliability --clients 16 --soak-s 120 --out docs/reliability

Writes ``<out>/<UTC date>/reliability.json`` and ``reliability.md``. Sections (``--only`` picks):

- ``hostile``: every request of :mod:`benchmarks.hostile` against a gateway with the default
  limits (10,000 documents, 20 MiB), before and after the soak: no 5xx, every 4xx a JSON body.
- ``fuzz``: schemathesis' cases for every operation (every check) and the hostile requests, the
  same list twice after a warm-up, keys and Redis limits on: check failures, RSS after each pass
  (the second must add < 5 %) and, in a tracemalloc'd twin, where the heap grew
  (:mod:`benchmarks.fuzz_memory`).
- ``soak``: N clients x T seconds of valid rerank requests (1-100 documents) against a real
  gateway process (``static`` engine: the gateway's own code is what runs), RSS every second.
- ``upstream``: a pool over two stub replicas under load; one is killed (SIGKILL), then
  replaced by a slow one (1 s per request): errors and p99 per phase.
- ``redis``: per-key limits in Redis; Redis killed under load then restarted, with
  ``redis_failure = "closed"`` (503 + Retry-After meanwhile) and ``"open"`` (keeps serving).
- ``sigterm``: SIGTERM with requests in flight: every one is answered, then the process exits.
- ``engine``: the vLLM engine on CPU (tiny random Qwen3, ``vllm-score``) killed under load:
  every request gets exactly one response, 503 + Retry-After meanwhile; recovery time. Holds
  ``/tmp/vllm.lock`` so two vLLM engines never start at once on a shared machine.

"Recovery" is the time from the fault's end (process back, or the kill for self-healing
faults) to the first 200. Every request's outcome is counted: a request without a response
(exception, timeout) is "lost".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.hostile import hostile_cases, send_raw

ROOT = Path(__file__).resolve().parent.parent
KEY = "rk-reliability-long-run-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready in {timeout} s")


class Proc:
    """A child process with its log file; stopped (TERM, then KILL) on exit."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._fh = log.open("wb")
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=self._fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> float:
        """Signal the process and wait; seconds it took to exit."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._fh.close()
        return time.monotonic() - start


class Gateway(Proc):
    def __init__(self, config: str, workdir: Path, name: str, traced: Path | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = workdir / f"{name}.toml"
        path.write_text(config)
        # traced: the same gateway under tracemalloc, a snapshot into this folder per SIGUSR2.
        entry = ["benchmarks.fuzz_memory", "traced-serve", str(traced)] if traced else ["gateway"]
        super().__init__(
            [sys.executable, "-m", *entry, "serve", "--config", str(path), "--port", str(self.port)],
            workdir / f"{name}.log",
            env={"HF_HUB_OFFLINE": "1"},
        )

    def ready(self, timeout: float = 120) -> Gateway:
        _wait_http(f"{self.url}/ready", self.proc, timeout)
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


def _docs(i: int) -> list[str]:
    return [f"document {i}-{j} about topic {j % 7}" for j in range(1 + i % 100)]


@dataclass
class Load:
    """Outcomes of a closed-loop load: (t since start, status or -1 when lost, latency, retry-after)."""

    outcomes: list[tuple[float, int, float, str | None]] = field(default_factory=list)
    start: float = 0.0

    def summary(self, since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
        rows = [o for o in self.outcomes if since <= o[0] < until]
        lat = sorted(o[2] * 1e3 for o in rows if o[1] == 200)
        codes = Counter(str(o[1]) for o in rows)
        return {
            "requests": len(rows),
            "statuses": dict(sorted(codes.items())),
            "lost": codes.get("-1", 0),
            "five_xx": sum(v for k, v in codes.items() if k.startswith("5")),
            "errors": sum(v for k, v in codes.items() if k != "200"),
            "p50_ms": round(statistics.median(lat), 2) if lat else None,
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None,
            "retry_after_on_all_503": all(o[3] for o in rows if o[1] == 503),
        }

    def first_ok_after(self, t: float) -> float | None:
        oks = [o[0] + o[2] for o in self.outcomes if o[1] == 200 and o[0] >= t]
        return round(min(oks) - t, 3) if oks else None


async def _load(url: str, clients: int, seconds: float, load: Load, *, model: str, key: str | None = KEY,
                request_timeout: float = 30.0, backoff_503: float = 0.1, until: Any = None) -> None:
    """Closed-loop clients for ``seconds``, or until ``until()`` (checked between requests) is true."""
    load.start = time.monotonic()
    stop_at = load.start + seconds
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def client(n: int) -> None:
        i = n
        async with httpx.AsyncClient(base_url=url, timeout=request_timeout, headers=headers) as http:
            while time.monotonic() < stop_at and not (until is not None and until()):
                t0 = time.monotonic()
                body = {"model": model, "query": f"query {i}", "documents": _docs(i), "top_n": 5}
                try:
                    r = await http.post("/v2/rerank", json=body)
                    status, retry = r.status_code, r.headers.get("retry-after")
                except httpx.HTTPError:
                    status, retry = -1, None
                load.outcomes.append((t0 - load.start, status, time.monotonic() - t0, retry))
                if status != 200:
                    await asyncio.sleep(backoff_503)
                i += clients

    await asyncio.gather(*(client(n) for n in range(clients)))


# -- sections ---------------------------------------------------------------------------------


def hostile_pass(gw: Gateway) -> dict[str, Any]:
    tried = five = bad_body = 0
    failures: list[str] = []
    for case in hostile_cases("static", key=KEY, max_body_bytes=20 * 2**20, max_documents=10_000):
        tried += 1
        try:
            resp = send_raw("127.0.0.1", gw.port, case, timeout=60)
        except OSError as exc:
            failures.append(f"{case.name}: {type(exc).__name__}")
            continue
        if resp is None:
            continue
        if resp.status >= 500:
            five += 1
            failures.append(f"{case.name}: {resp.status}")
        elif resp.status >= 400 and case.expect not in ("parser_400", "any_non_5xx"):
            try:
                ok = set(resp.json()) == {"message", "id", "detail"}  # type: ignore[arg-type]
            except ValueError:
                ok = False
            if not ok:
                bad_body += 1
                failures.append(f"{case.name}: {resp.status} without the JSON error body")
    healthy = httpx.get(f"{gw.url}/ready", timeout=10).status_code == 200
    return {"tried": tried, "five_xx": five, "four_xx_without_json_body": bad_body, "failures": failures, "healthy_after": healthy}


def soak(workdir: Path, clients: int, seconds: float) -> dict[str, Any]:
    config = f'[logging]\nformat = "json"\n\n{_auth_toml()}[[models]]\nname = "static"\nengine = "static"\n'
    gw = Gateway(config, workdir, "soak").ready()
    try:
        before = hostile_pass(gw)
        rss: list[tuple[float, float]] = []
        load = Load()

        async def run() -> None:
            async def sampler() -> None:
                t0 = time.monotonic()
                while time.monotonic() - t0 < seconds + 1:
                    rss.append((round(time.monotonic() - t0, 1), round(gw.rss_mb(), 1)))
                    await asyncio.sleep(1.0)

            await asyncio.gather(_load(gw.url, clients, seconds, load, model="static"), sampler())

        asyncio.run(run())
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
    ports = [_free_port(), _free_port()]
    stubs = [
        Proc([sys.executable, "-m", "benchmarks.reliability", "stub", "--port", str(p)], workdir / f"stub-{p}.log")
        for p in ports
    ]
    for p, s in zip(ports, stubs, strict=True):
        _wait_http(f"http://127.0.0.1:{p}/health", s.proc, 30)
    urls = ", ".join(f'"http://127.0.0.1:{p}"' for p in ports)
    config = (
        f'[logging]\nformat = "json"\n\n[[models]]\nname = "pool"\nengine = "pool"\nprotocol = "cohere"\n'
        f"urls = [{urls}]\ntimeout_s = 10\neject_after_failures = 2\ncooldown_s = 2.0\n"
    )
    gw = Gateway(config, workdir, "pool").ready()
    load = Load()
    slow: Proc | None = None
    marks: dict[str, float] = {}
    try:

        async def run() -> None:
            async def faults() -> None:
                await asyncio.sleep(5)
                marks["kill"] = time.monotonic() - load.start
                stubs[1].stop(signal.SIGKILL)
                await asyncio.sleep(7)
                nonlocal slow
                marks["slow"] = time.monotonic() - load.start
                slow = Proc(
                    [sys.executable, "-m", "benchmarks.reliability", "stub", "--port", str(ports[1]), "--delay-s", "1.0"],
                    workdir / "stub-slow.log",
                )

            await asyncio.gather(_load(gw.url, clients, 25, load, model="pool", key=None), faults())

        asyncio.run(run())
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
        for s in [*stubs, *([slow] if slow else [])]:
            s.stop(signal.SIGKILL)


def _redis(port: int, workdir: Path) -> Proc:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    proc = Proc([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)], workdir / f"redis-{port}-{time.monotonic_ns()}.log")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return proc
        time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def redis_faults(workdir: Path, clients: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("closed", "open"):
        port = _free_port()
        redis = _redis(port, workdir)
        config = (
            f'[logging]\nformat = "json"\n\n[limits]\nredis_url = "redis://127.0.0.1:{port}/0"\n'
            f'redis_failure = "{mode}"\n\n{_auth_toml(rpm=10**6)}[[models]]\nname = "static"\nengine = "static"\n'
        )
        gw = Gateway(config, workdir, f"redis-{mode}").ready()
        load = Load()
        marks: dict[str, float] = {}
        try:

            async def run() -> None:
                async def faults() -> None:
                    nonlocal redis
                    await asyncio.sleep(3)
                    marks["kill"] = time.monotonic() - load.start
                    redis.stop(signal.SIGKILL)
                    await asyncio.sleep(5)
                    redis = await asyncio.to_thread(_redis, port, workdir)
                    marks["restart"] = time.monotonic() - load.start

                await asyncio.gather(_load(gw.url, clients, 15, load, model="static"), faults())

            asyncio.run(run())
            down = load.summary(marks["kill"], marks["restart"])
            out[mode] = {
                "before": load.summary(0, marks["kill"]),
                "redis_down": down,
                "after_restart": load.summary(marks["restart"] + 2.0),
                "recovery_s_after_restart": (
                    load.first_ok_after(marks["restart"]) if mode == "closed" else load.first_ok_after(marks["kill"])
                ),
                "five_xx_other_than_503": sum(v for k, v in down["statuses"].items() if k.startswith("5") and k != "503"),
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
        marks: dict[str, float] = {}
        try:
            # The engine-core process only: its executor's VLLM::Worker child is left to notice.
            cores = [
                p for p in psutil.Process(gw.proc.pid).children(recursive=True)
                if "EngineCore" in " ".join([p.name(), *p.cmdline()])
            ]

            def recovered_a_while_ago() -> bool:
                if "kill" not in marks:
                    return False
                ok = load.first_ok_after(marks["kill"])
                return ok is not None and time.monotonic() - load.start > marks["kill"] + ok + _AFTER_RECOVERY_S

            async def run() -> None:
                async def faults() -> None:
                    await asyncio.sleep(3)
                    marks["kill"] = time.monotonic() - load.start
                    for core in cores:
                        with contextlib.suppress(psutil.Error):
                            core.send_signal(signal.SIGKILL)

                await asyncio.gather(
                    _load(gw.url, clients, window_s, load, model="vs", backoff_503=0.5, until=recovered_a_while_ago),
                    faults(),
                )

            asyncio.run(run())
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


# -- report -----------------------------------------------------------------------------------


def _md(report: dict[str, Any]) -> str:
    lines = [f"# Reliability run {report['date']}", "", f"Machine: {report['machine']}. Command: `{report['command']}`.", ""]
    if ran := report.get("section_dates"):
        lines += ["Sections re-run later (the others ran at the time above): " + ", ".join(f"{k} {v}" for k, v in ran.items()) + ".", ""]
    lines += ["| Section | Figure | Value |", "|---|---|---|"]

    def row(section: str, figure: str, value: Any) -> None:
        lines.append(f"| {section} | {figure} | {value} |")

    if (f := report.get("fuzz")) and "passes" in f:
        p1, p2 = f["passes"]
        row("fuzz", "schemathesis cases per pass (out of scope) / check failures pass 1, 2",
            f"{p1['schemathesis_cases']} ({p1['out_of_scope']}) / {p1['check_failures']}, {p2['check_failures']}")
        row("fuzz", "hostile requests per pass / 5xx pass 1, 2", f"{p1['hostile_requests']} / {p1['hostile_5xx']}, {p2['hostile_5xx']}")
        r = f["rss_mb"]
        row("fuzz", "RSS MB after warm-up / pass 1 / pass 2",
            f"{r['after_warmup']} / {r['after_pass_1']} (+{f['pass_1_growth_pct']} %) / {r['after_pass_2']} (+{f['pass_2_growth_pct']} %)")
        row("fuzz", f"second pass adds < {f['bound_second_pass']:.0%}", f["second_pass_within_bound"])
        if h := f.get("heap"):
            row("fuzz", "traced Python heap MB (warm / pass 1 / pass 2)", " / ".join(str(v) for v in h["traced_mb"].values()))
            for phase in ("warm->pass1", "pass1->pass2"):
                top = ", ".join(f"{d['where']} {d['kb']:+} kB" for d in h.get(phase, [])[:4])
                row("fuzz", f"heap growth {phase}, largest lines", top)
        row("fuzz", "5xx counted by the server, tracebacks logged", f"{f['server_5xx_counted']}, {f['tracebacks_logged']}")
    elif f:
        row("fuzz", "skipped", f.get("skipped"))
    if s := report.get("soak"):
        row("soak", "clients x minutes", f"{s['clients']} x {s['seconds'] / 60:.1f} = {s['client_minutes']}")
        row("soak", "requests tried / 5xx / errors / lost", f"{s['requests']} / {s['five_xx']} / {s['errors']} / {s['lost']}")
        row("soak", "req/s, p50 / p99 ms", f"{s['req_per_s']}, {s['p50_ms']} / {s['p99_ms']}")
        row("soak", "RSS MB start / end / max", f"{s['rss_mb_start']} / {s['rss_mb_end']} / {s['rss_mb_max']}")
        for tag in ("hostile_before", "hostile_after"):
            h = s[tag]
            row("hostile", f"{tag}: tried / 5xx / 4xx without JSON body / healthy after", f"{h['tried']} / {h['five_xx']} / {h['four_xx_without_json_body']} / {h['healthy_after']}")
        row("soak", "5xx counted by the server, tracebacks logged", f"{s['server_5xx_counted']}, {s['tracebacks_logged']}")
    if u := report.get("upstream"):
        for phase in ("before_kill", "replica_killed", "replica_slow"):
            p = u[phase]
            row("upstream", f"{phase}: requests / errors / lost / p99 ms", f"{p['requests']} / {p['errors']} / {p['lost']} / {p['p99_ms']}")
        row("upstream", "recovery after the kill (s to first 200)", u["recovery_s_after_kill"])
    if r := report.get("redis"):
        for mode, m in r.items():
            d = m["redis_down"]
            row("redis", f"{mode}: while down: requests / statuses / Retry-After on every 503", f"{d['requests']} / {d['statuses']} / {d['retry_after_on_all_503']}")
            row("redis", f"{mode}: recovery (s)", m["recovery_s_after_restart"])
            row("redis", f"{mode}: after restart: errors / lost", f"{m['after_restart']['errors']} / {m['after_restart']['lost']}")
    if t := report.get("sigterm"):
        row("sigterm", "in flight / answered 200 / exit s / exit code", f"{t['in_flight']} / {t['answered_200']} / {t['exit_s']} / {t['exit_code']}")
    if e := report.get("engine"):
        if "skipped" in e:
            row("engine", "skipped", e["skipped"])
        else:
            a = e.get("until_recovery") or e["after_kill"]
            row("engine", "kill to recovery: requests / statuses / lost / Retry-After on every 503", f"{a['requests']} / {a['statuses']} / {a['lost']} / {a['retry_after_on_all_503']}")
            row("engine", "recovery (s from kill to first 200)", e["recovery_s_after_kill"])
            if "window_s" in e:
                row("engine", "window (s) / first start of the engine (s)", f"{e['window_s']:g} / {e['first_start_s']}")
                restarts = [ev for ev in e["gateway_events"] if ev["event"] == "engine_restarted"]
                failed = [ev for ev in e["gateway_events"] if ev["event"] == "engine_restart_failed"]
                row("engine", "restart: engine start s / failed attempts", f"{restarts[0]['load_s'] if restarts else None} / {len(failed)}")
            if r := e.get("after_recovery"):
                row("engine", "after recovery: requests / statuses / lost", f"{r['requests']} / {r['statuses']} / {r['lost']}")
    lines += ["", "Full figures (per-phase statuses, RSS timeline) are in reliability.json.", ""]
    return "\n".join(lines)


def stub_main(argv: list[str]) -> None:
    """A stub upstream (benchmarks.stub_upstream), optionally slow: ``stub --port P --delay-s S``."""
    import uvicorn

    from benchmarks.stub_upstream import app as stub_app

    parser = argparse.ArgumentParser(prog="benchmarks.reliability stub")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-s", type=float, default=0.0)
    args = parser.parse_args(argv)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("rerank") and args.delay_s:
            await asyncio.sleep(args.delay_s)
        await stub_app(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


SECTIONS = ("fuzz", "soak", "upstream", "redis", "sigterm", "engine")


def fuzz(workdir: Path, per_operation: int) -> dict[str, Any]:
    from benchmarks.fuzz_memory import fuzz_memory

    redis = None
    if shutil.which("redis-server"):
        port = _free_port()
        redis = _redis(port, workdir)
        redis.port = port  # type: ignore[attr-defined]
    try:
        return fuzz_memory(workdir, Gateway, redis, per_operation)
    finally:
        if redis is not None:
            redis.stop(signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["stub"]:
        stub_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--soak-s", type=float, default=120.0)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--out", default=str(ROOT / "docs" / "reliability"))
    parser.add_argument("--engine-window-s", type=float, default=420.0,
                        help="engine section: longest wait for the first 200 after the kill")
    parser.add_argument("--fuzz-examples", type=int, default=100,
                        help="fuzz section: schemathesis examples per operation and mode (positive, negative)")
    parser.add_argument("--keep-logs", default=None, help="copy the engine section's gateway log into this folder")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    now = datetime.now(UTC)
    report: dict[str, Any] = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()} (shared with other jobs)",
        "command": "python -m benchmarks.reliability " + " ".join(argv),
    }
    out = Path(args.out) / now.strftime("%Y-%m-%d")
    with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
        workdir = Path(tmp)
        steps = {
            "fuzz": lambda: fuzz(workdir, args.fuzz_examples),
            "soak": lambda: soak(workdir, args.clients, args.soak_s),
            "upstream": lambda: upstream(workdir, max(2, args.clients // 2)),
            "redis": lambda: redis_faults(workdir, max(2, args.clients // 2)),
            "sigterm": lambda: sigterm(workdir),
            "engine": lambda: engine_kill(workdir, 4, args.engine_window_s, Path(args.keep_logs) if args.keep_logs else None),
        }
        for name in SECTIONS:
            if name not in only:
                continue
            print(f"[{datetime.now(UTC):%H:%M:%S}] {name} ...", flush=True)
            try:
                report[name] = steps[name]()
            except Exception as exc:  # a section that cannot run is reported, not fatal
                report[name] = {"skipped": f"{type(exc).__name__}: {exc}"}
            report.setdefault("section_dates", {})[name] = f"{datetime.now(UTC):%H:%M} UTC"
            print(json.dumps(report[name], default=str)[:600], flush=True)
            _write(report, out)  # after every section: a run stopped early keeps what it measured
    print(f"wrote {out}/reliability.json and reliability.md")
    return 0


def _write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "reliability.json"
    if previous.exists():  # sections run separately on one day (e.g. `--only engine`) add up
        merged = json.loads(previous.read_text())
        merged.update({k: v for k, v in report.items() if k in SECTIONS})
        merged["section_dates"] = {**merged.get("section_dates", {}), **report.get("section_dates", {})}
        merged["command"] = " ; ".join(dict.fromkeys([*merged.get("command", "").split(" ; "), report["command"]]))
        report = merged
    (out / "reliability.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "reliability.md").write_text(_md(report))


if __name__ == "__main__":
    raise SystemExit(main())
