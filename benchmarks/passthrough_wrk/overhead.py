"""Gateway overhead: what the gateway adds per request, and its passthrough against LiteLLM's.

    .venv/bin/python -m benchmarks.passthrough_wrk overhead --out docs/benchmarks/cpu-$(date +%F)
    .venv/bin/python -m benchmarks.passthrough_wrk overhead --tracing CHECKOUT --out DIR   # tracing off / on / without

Everything runs on this machine over loopback, bounded in requests:

1. In-process (no sockets): the gateway's ASGI app with the zero-cost ``static`` engine against
   the trivial ASGI app of ``benchmarks.stub_upstream`` (decode JSON, answer in Cohere's shape),
   same 100-document bodies; the difference is the gateway's own cost. A cProfile of the gateway
   run, grouped by component, says where that time goes.
2. Over HTTP, ``rerank-gateway bench --compare`` (one client process, alternating request by
   request): gateway(static) vs the stub, one client -> added p50 latency.
3. Passthrough: the gateway's ``pool`` engine (protocol cohere) and LiteLLM proxy's cohere
   rerank provider, both in front of the same stub upstream, in one alternating run at 1 and 8
   clients. Besides end-to-end req/s (client, proxies and stub share the cores, which compresses
   the ratio), the CPU seconds each proxy process used per request are read from /proc: that
   ratio is the capacity ratio when the proxy, not the box, is the bottleneck.

LiteLLM is installed by this script into its own venv (``bench-out/litellm-venv``, git-ignored);
it is not a dependency of the product.

The wrk-driven comparison at 1 and 32 clients, with 1 and N gateway workers, is
``python -m benchmarks.passthrough_wrk`` (it reuses :class:`Proc` from here). Until 2026-12-04 this
module was ``benchmarks/cpu_overhead.py`` (``python -m benchmarks.cpu_overhead``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, free_port, wait_http

VENV = ROOT / "bench-out" / "litellm-venv"
LITELLM_SPEC = os.environ.get("LITELLM_SPEC", "litellm[proxy]")


class Proc:
    """A server subprocess on loopback with its log file, and its CPU time from /proc."""

    def __init__(
        self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
    ) -> None:
        self.name = name
        self.log = (log_dir / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(
            argv, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )

    def wait_http(self, url: str, timeout: float = 180.0, headers: dict[str, str] | None = None) -> None:
        wait_http(url, self.proc, timeout, name=self.name, headers=headers, interval=0.3)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its children (process tree)."""
        tick = os.sysconf("SC_CLK_TCK")
        children: dict[int, list[int]] = {}
        stats: dict[int, list[str]] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                stats[int(d.name)] = fields
                children.setdefault(int(fields[1]), []).append(int(d.name))
        total, todo = 0.0, [self.proc.pid]
        while todo:
            pid = todo.pop()
            if pid in stats:
                total += (int(stats[pid][11]) + int(stats[pid][12])) / tick
            todo += children.get(pid, [])
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def ensure_litellm() -> Path:
    exe = VENV / "bin" / "litellm"
    if not exe.exists():
        print(f"installing {LITELLM_SPEC} into {VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", LITELLM_SPEC], check=True)
    return exe


def litellm_version() -> str:
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


# -- 1. in-process ------------------------------------------------------------------------------
_BUCKETS = [
    ("engine (static)", "adapters/runtimes/static.py"),
    ("rerank service (dedup, sort, response)", "gateway/serving/service.py"),
    ("rerank service (dedup, sort, response)", "gateway/serving/jobs.py"),  # its request -> job half
    ("routes", "gateway/http/routes.py"),
    ("gateway middleware, auth, access log, metrics", "gateway/"),
    ("structlog / logging", "structlog"),
    ("prometheus_client", "prometheus_client"),
    ("Litestar (routing, request/response)", "litestar"),
    ("asyncio", "asyncio"),
]


def _bucket(filename: str, func: str) -> str:
    if "msgspec" in func or "msgspec" in filename:
        return "msgspec (JSON decode/encode)"
    for name, needle in _BUCKETS:
        if needle in filename:
            return name
    if filename == "~" and ("write" in func or "print" in func):
        return "writes (log output)"
    return "other (builtins: str ops, dict, sorting)"


def _scope(body: bytes, path: str = "/v2/rerank") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def _asgi_call(app: Callable[..., Any], body: bytes, path: str = "/v2/rerank") -> None:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    status: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(_scope(body, path), receive, send)
    if status != [200]:
        raise RuntimeError(f"in-process call answered {status}")


def in_process(n: int, log_path: Path) -> dict[str, Any]:
    from benchmarks.stub_upstream import app as stub
    from gateway.app import create_app
    from gateway.bench.report import percentile
    from gateway.bench.workload import WorkloadSpec, build_workload
    from gateway.config.settings import load_settings

    bodies = [r.body for r in build_workload(WorkloadSpec(requests=64, documents=100, model="static"))]
    cfg = log_path.parent / "static-inproc.toml"
    cfg.write_text('[[models]]\nname = "static"\nengine = "static"\n')

    async def timed(app: Callable[..., Any], count: int) -> list[float]:
        for b in bodies[:8]:
            await _asgi_call(app, b)
        out = []
        for i in range(count):
            t = time.perf_counter()
            await _asgi_call(app, bodies[i % len(bodies)])
            out.append((time.perf_counter() - t) * 1e3)
        return sorted(out)

    async def main() -> dict[str, Any]:
        app = create_app(load_settings(cfg))
        async with app.lifespan():
            while not app.state.registry.ready:
                await asyncio.sleep(0.05)
            res: dict[str, list[float]] = {"stub": [], "gateway": []}
            for _ in range(3):  # interleave blocks so machine drift hits both
                res["stub"] += await timed(stub, n // 3)
                res["gateway"] += await timed(app, n // 3)
            prof = cProfile.Profile()
            prof.enable()
            await timed(app, n // 3)
            prof.disable()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        buckets: dict[str, float] = {}
        for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.items():
            key = _bucket(filename, func)
            buckets[key] = buckets.get(key, 0.0) + tt
        total = sum(buckets.values())
        out = {}
        for name, ts in res.items():
            ts.sort()
            out[name] = {
                "p50": percentile(ts, 50),
                "p90": percentile(ts, 90),
                "p99": percentile(ts, 99),
                "mean": sum(ts) / len(ts),
                "n": len(ts),
            }
        out["added_p50_ms"] = out["gateway"]["p50"] - out["stub"]["p50"]
        out["profile_share"] = {k: v / total for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])}
        out["profile_ms_per_request"] = {k: v / (n // 3 + 8) * 1e3 for k, v in buckets.items()}
        return out

    # The access log line goes to a file, as it would in production (not to a terminal).
    saved = os.dup(1)
    with log_path.open("wb") as f:
        os.dup2(f.fileno(), 1)
        try:
            return asyncio.run(main())
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


# -- 2 and 3: over HTTP ---------------------------------------------------------------------------
def bench(args: list[str], out: Path, secret: str | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "gateway", "bench", *args, "--no-progress", "--out", str(out)]
    print("$", " ".join(cmd[2:]).replace(secret or "\0", "$LITELLM_MASTER_KEY"), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    if secret:  # the reports quote the command line: keep the (throwaway) proxy key out of them
        for name in ("bench.json", "report.md"):
            path = out / name
            path.write_text(path.read_text().replace(secret, "$LITELLM_MASTER_KEY"))
    return json.loads((out / "bench.json").read_text())


# -- tracing: CPU per request off, on, and in a build without it (--tracing) ------------------------
# Run in a fresh process per measurement, from the checkout given (cwd first on sys.path), so the
# "without" build is really that code: the gateway's ASGI app, static engine, 100-document bodies,
# CPU seconds of the whole process (exporter thread included) over `n` requests after a warm-up.
_TRACING_WORKER = """
import asyncio, json, os, sys, time
sys.path.insert(0, os.getcwd())
from gateway.app import create_app
from schemas.config import Settings, StaticEngineConfig
n = int(sys.argv[1])
docs = [f"document {i} about the topic with some words in it" for i in range(100)]
body = json.dumps({"model": "m", "query": "what is the topic", "documents": docs, "top_n": 10}).encode()
scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
         "path": "/v2/rerank", "raw_path": b"/v2/rerank", "query_string": b"", "root_path": "",
         "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                     (b"content-length", str(len(body)).encode()),
                     (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
         "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
async def call(app):
    done = asyncio.Event()
    async def receive():
        if not done.is_set():
            done.set()
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
    status = []
    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
    await app({**scope, "state": {}}, receive, send)
    assert status == [200], status
async def main():
    app = create_app(Settings(models=(StaticEngineConfig(name="m"),)), configure_logs=False)
    async with app.lifespan():
        while not app.state.registry.ready:
            await asyncio.sleep(0.01)
        for _ in range(200):
            await call(app)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(n):
            await call(app)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"cpu_ms_per_request": cpu / n * 1e3, "wall_ms_per_request": wall / n * 1e3}))
asyncio.run(main())
"""


def tracing_cpu(before: Path, rounds: int, n: int) -> dict[str, Any]:
    """CPU ms per request of three builds side by side, rounds interleaved in rotating order."""
    import statistics
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):  # an OTLP/HTTP endpoint that takes every export
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    plain = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    variants = {
        "without (build before tracing)": (before, plain),
        "tracing off": (ROOT, plain),
        "tracing on (OTLP to loopback)": (
            ROOT,
            {**plain, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}"},
        ),
    }
    runs: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    try:
        for r in range(rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                cwd, env = variants[name]
                out = subprocess.run(
                    [sys.executable, "-c", _TRACING_WORKER, str(n)],
                    cwd=cwd,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"{name}: the worker failed:\n{out.stderr[-3000:]}")
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1])["cpu_ms_per_request"])
                print(f"round {r + 1}: {name}: {runs[name][-1]:.4f} ms CPU/request", flush=True)
    finally:
        sink.shutdown()
    base = runs["without (build before tracing)"]
    return {
        "requests_per_run": n,
        "rounds": rounds,
        "runs_cpu_ms_per_request": runs,
        "median_cpu_ms_per_request": {k: statistics.median(v) for k, v in runs.items()},
        # Per round, each build against the build without tracing: the spread is the noise.
        "ratio_to_without_per_round": {k: [b / a for a, b in zip(base, v, strict=True)] for k, v in runs.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.passthrough_wrk overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", default="bench-out/cpu-overhead")
    ap.add_argument("--requests", type=int, default=400, help="measured requests per endpoint and level")
    ap.add_argument("--skip-litellm", action="store_true")
    ap.add_argument(
        "--tracing",
        metavar="CHECKOUT",
        type=Path,
        help="only the tracing comparison: CPU per request of CHECKOUT (a build without tracing: "
        "git archive 5af38df | tar -x -C CHECKOUT), this build with tracing off, and with it on",
    )
    ap.add_argument("--rounds", type=int, default=7, help="--tracing: interleaved rounds")
    args = ap.parse_args()
    out = (ROOT / args.out).resolve() if not Path(args.out).is_absolute() else Path(args.out)
    if args.tracing is not None:
        out.mkdir(parents=True, exist_ok=True)
        result = tracing_cpu(args.tracing.resolve(), args.rounds, args.requests)
        result["command"] = " ".join(["python -m benchmarks.passthrough_wrk overhead", *sys.argv[1:]])
        (out / "tracing_cpu.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result["median_cpu_ms_per_request"], indent=1))
        return 0
    logs = ROOT / "bench-out" / "cpu-overhead-logs"
    out.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"requests": args.requests}

    print("1/3 in-process: gateway ASGI app vs trivial ASGI app", flush=True)
    results["in_process"] = in_process(max(300, args.requests), logs / "inproc-access.log")

    procs: list[Proc] = []
    try:
        sp, gp, pp = free_port(), free_port(), free_port()
        stub = Proc("stub", [sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(sp)], logs)
        procs.append(stub)
        (logs / "static.toml").write_text('[[models]]\nname = "static"\nengine = "static"\n')
        (logs / "pool.toml").write_text(
            f'[[models]]\nname = "rerank"\nengine = "pool"\nprotocol = "cohere"\n'
            f'urls = ["http://127.0.0.1:{sp}"]\nmodel = "stub"\n'
        )
        gw = Proc(
            "gateway-static",
            [sys.executable, "-m", "gateway", "serve", "--config", str(logs / "static.toml"), "--port", str(gp)],
            logs,
        )
        pool = Proc(
            "gateway-pool",
            [sys.executable, "-m", "gateway", "serve", "--config", str(logs / "pool.toml"), "--port", str(pp)],
            logs,
        )
        procs += [gw, pool]
        stub.wait_http(f"http://127.0.0.1:{sp}/health")
        gw.wait_http(f"http://127.0.0.1:{gp}/ready")
        pool.wait_http(f"http://127.0.0.1:{pp}/ready")

        print("2/3 over HTTP: gateway(static) vs stub, 1 client, alternating", flush=True)
        results["overhead_http"] = bench(
            [
                f"http://127.0.0.1:{gp}",
                "--model",
                "static",
                "--compare",
                f"http://127.0.0.1:{sp}",
                "--label",
                "gateway (static engine)",
                "--compare-label",
                "trivial ASGI stub",
                "--requests",
                str(args.requests),
                "--concurrency",
                "1",
                "--title",
                "Gateway overhead (static engine)",
            ],
            out / "overhead",
        )
        if not args.skip_litellm:
            exe = ensure_litellm()
            lp = free_port()
            (logs / "litellm.yaml").write_text(
                "model_list:\n  - model_name: rerank\n    litellm_params:\n      model: cohere/rerank-v3.5\n"
                f"      api_base: http://127.0.0.1:{sp}\n      api_key: sk-stub\n"
            )
            key = "sk-bench-" + secrets.token_hex(24)
            lite = Proc(
                "litellm",
                [str(exe), "--config", str(logs / "litellm.yaml"), "--port", str(lp), "--num_workers", "1"],
                logs,
                env={"LITELLM_MASTER_KEY": key, "LITELLM_LOG": "ERROR"},
            )
            procs.append(lite)
            lite.wait_http(f"http://127.0.0.1:{lp}/health/liveliness")
            print("3/3 passthrough: gateway(pool -> stub) vs LiteLLM(cohere -> stub), 1 and 8 clients", flush=True)
            cpu0 = {p.name: p.cpu_s() for p in (pool, lite, stub)}
            results["passthrough"] = bench(
                [
                    f"http://127.0.0.1:{pp}",
                    "--model",
                    "rerank",
                    "--compare",
                    f"http://127.0.0.1:{lp}/v2/rerank",
                    "--compare-api-key",
                    key,
                    "--label",
                    "gateway (pool -> stub)",
                    "--compare-label",
                    "LiteLLM (cohere -> stub)",
                    "--requests",
                    str(args.requests),
                    "--concurrency",
                    "1,8",
                    "--title",
                    "Passthrough: gateway vs LiteLLM",
                ],
                out / "passthrough",
                secret=key,
            )
            cpu1 = {p.name: p.cpu_s() for p in (pool, lite, stub)}
            # Each proxy served requests x levels (+ warm-up); the stub served both.
            served = sum(s["requests"] for s in results["passthrough"]["summaries"]) // 2 + max(2, 1) + max(2, 8)
            results["passthrough_cpu_ms_per_request"] = {
                "gateway": (cpu1["gateway-pool"] - cpu0["gateway-pool"]) / served * 1e3,
                "litellm": (cpu1["litellm"] - cpu0["litellm"]) / served * 1e3,
                "stub": (cpu1["stub"] - cpu0["stub"]) / (2 * served) * 1e3,
            }
            results["litellm_version"] = litellm_version()
    finally:
        for p in procs:
            p.stop()
    (out / "cpu_overhead.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({k: v for k, v in results.items() if k not in ("overhead_http", "passthrough")}, indent=1))
    print(f"wrote {out}")
    return 0
