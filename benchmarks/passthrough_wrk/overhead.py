"""Gateway overhead: what the gateway adds per request, in-process and over HTTP; tracing's CPU.

    .venv/bin/python -m benchmarks.passthrough_wrk overhead --out docs/benchmarks/cpu-$(date +%F)
    .venv/bin/python -m benchmarks.passthrough_wrk overhead --tracing CHECKOUT --out DIR   # tracing off / on / without

Everything runs on this machine over loopback, bounded in requests:

1. In-process (no sockets): the gateway's ASGI app with the zero-cost ``static`` engine against
   the trivial ASGI app of ``benchmarks.stub_upstream`` (decode JSON, answer in Cohere's shape),
   same 100-document bodies, blocks interleaved; the difference is the gateway's own cost.
2. Over HTTP, ``rerank-gateway bench --compare`` (one client process, alternating request by
   request): gateway(static) vs the stub, one client -> added p50 latency.

The passthrough against LiteLLM is the suite's main run (``python -m benchmarks.passthrough_wrk``).
Removed on 2026-12-05, answered in cpu-2026-11-30 and cpu-2026-12-01-paused: this command's own
LiteLLM comparison through ``bench --compare`` (part 3) and the cProfile of the in-process run
grouped by component.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Proc, free_port

# -- in-process: a fresh process per measurement, from the checkout given (cwd first on sys.path), so
# a "without" build (--tracing) is really that code. The gateway's ASGI app (static engine) or the
# stub's, 100-document bodies; after a warm-up, each call's wall time and the process's CPU seconds
# (exporter thread included) over `n` calls. argv: target, n, result file; stdout is the access log.
_WORKER = """
import asyncio, json, os, statistics, sys, time
sys.path.insert(0, os.getcwd())
target, n, result = sys.argv[1], int(sys.argv[2]), sys.argv[3]
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
async def measure(app):
    for _ in range(200):
        await call(app)
    walls, cpu = [], time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        await call(app)
        walls.append(time.perf_counter() - t)
    cpu = time.process_time() - cpu
    out = {"cpu_ms_per_request": cpu / n * 1e3, "p50_ms": statistics.median(walls) * 1e3}
    open(result, "w").write(json.dumps(out))
async def main():
    if target == "stub":
        from benchmarks.stub_upstream import app
        return await measure(app)
    from gateway.app import create_app
    from schemas.config import Settings, StaticEngineConfig
    app = create_app(Settings(models=(StaticEngineConfig(name="m"),)), configure_logs=target == "gateway")
    async with app.lifespan():
        while not app.state.registry.ready:
            await asyncio.sleep(0.01)
        await measure(app)
asyncio.run(main())
"""


def _worker(target: str, n: int, cwd: Path, env: dict[str, str], work: Path) -> dict[str, float]:
    """One measurement in a fresh process (``_WORKER``); its access log into ``work``."""
    result = work / f"{target}.json"
    with (work / f"{target}-access.log").open("wb") as log:
        proc = subprocess.run(
            [sys.executable, "-c", _WORKER, target, str(n), str(result)],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"{target}: the worker failed:\n{proc.stderr[-3000:]}")
    out: dict[str, float] = json.loads(result.read_text())
    return out


def in_process(n: int, work: Path) -> dict[str, Any]:
    """The gateway's app against the stub's, three interleaved rounds: p50 wall time per call."""
    import statistics

    runs: dict[str, list[float]] = {"stub": [], "gateway": []}
    for _ in range(3):
        for target, p50s in runs.items():
            p50s.append(_worker(target, n, ROOT, dict(os.environ), work)["p50_ms"])
    out: dict[str, Any] = {k: {"p50": statistics.median(v), "p50_per_round": v, "n": n} for k, v in runs.items()}
    out["added_p50_ms"] = out["gateway"]["p50"] - out["stub"]["p50"]
    return out


# -- 2. over HTTP ------------------------------------------------------------------------------------
def bench(args: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "gateway", "bench", *args, "--no-progress", "--out", str(out)]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads((out / "bench.json").read_text())
    return result


# -- tracing: CPU per request off, on, and in a build without it (--tracing) ------------------------
def tracing_cpu(before: Path, rounds: int, n: int, work: Path) -> dict[str, Any]:
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
                target = "gateway-nolog"  # logs unconfigured, as the tracing report measured
                runs[name].append(_worker(target, n, cwd, env, work)["cpu_ms_per_request"])
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
        logs = ROOT / "bench-out" / "cpu-overhead-logs"
        logs.mkdir(parents=True, exist_ok=True)
        result = tracing_cpu(args.tracing.resolve(), args.rounds, args.requests, logs)
        result["command"] = " ".join(["python -m benchmarks.passthrough_wrk overhead", *sys.argv[1:]])
        (out / "tracing_cpu.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result["median_cpu_ms_per_request"], indent=1))
        return 0
    logs = ROOT / "bench-out" / "cpu-overhead-logs"
    out.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"requests": args.requests}

    print("1/2 in-process: gateway ASGI app vs trivial ASGI app", flush=True)
    results["in_process"] = in_process(max(300, args.requests), logs)

    sp, gp = free_port(), free_port()
    (logs / "static.toml").write_text('[[models]]\nname = "static"\nengine = "static"\n')
    stub = Proc([sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(sp)], logs / "stub.log")
    gw = Proc(
        [sys.executable, "-m", "gateway", "serve", "--config", str(logs / "static.toml"), "--port", str(gp)],
        logs / "gateway-static.log",
    )
    try:
        stub.wait_http(f"http://127.0.0.1:{sp}/health")
        gw.wait_http(f"http://127.0.0.1:{gp}/ready")
        print("2/2 over HTTP: gateway(static) vs stub, 1 client, alternating", flush=True)
        results["overhead_http"] = bench(
            [f"http://127.0.0.1:{gp}", "--model", "static", "--compare", f"http://127.0.0.1:{sp}"]
            + ["--label", "gateway (static engine)", "--compare-label", "trivial ASGI stub"]
            + ["--requests", str(args.requests), "--concurrency", "1", "--title", "Gateway overhead (static engine)"],
            out / "overhead",
        )
    finally:
        stub.stop()
        gw.stop()
    (out / "cpu_overhead.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({k: v for k, v in results.items() if k != "overhead_http"}, indent=1))
    print(f"wrote {out}")
    return 0
