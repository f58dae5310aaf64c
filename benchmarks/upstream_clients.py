"""Client CPU per upstream call: httpx, httpx on aiohttp's transport, and aiohttp, side by side.

    .venv/bin/python -m benchmarks.upstream_clients --out docs/benchmarks/cpu-$(date +%F)

How the pool engine's HTTP client was chosen. One process (uvloop, as the gateway runs) posts
the same 100-document rerank body (``top_n`` 10) to the stub upstream
(``benchmarks.stub_upstream``, its own process) with each client at 1 and 32 concurrent calls,
interleaved over rounds, and reads its own CPU time (``time.process_time``) per completed
call. Keep-alive pools of 64 connections everywhere. ``httpx-aiohttp`` is measured when
installed (it is not a dependency). Writes ``upstream_clients.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from benchmarks.cpu_overhead import ROOT, _free_port
from benchmarks.passthrough_wrk import _body


async def _client(kind: str, url: str, body: bytes) -> tuple[Callable[[], Awaitable[bytes]], Callable[[], Awaitable[None]]]:
    headers = {"Content-Type": "application/json"}
    if kind == "aiohttp":
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))

        async def post_aio() -> bytes:
            async with session.post(url, data=body, headers=headers) as r:
                return await r.read()

        return post_aio, session.close
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    if kind == "httpx":
        client = httpx.AsyncClient(limits=limits)
    else:
        from httpx_aiohttp import AiohttpTransport

        client = httpx.AsyncClient(transport=AiohttpTransport(limits=limits))

    async def post_httpx() -> bytes:
        return (await client.post(url, content=body, headers=headers)).content

    return post_httpx, client.aclose


async def _measure(kind: str, url: str, body: bytes, clients: int, calls: int) -> float:
    post, close = await _client(kind, url, body)

    async def worker(n: int) -> None:
        for _ in range(n):
            await post()

    try:
        await asyncio.gather(*(worker(10) for _ in range(clients)))  # open the connections
        per = max(1, calls // clients)
        t = time.process_time()
        await asyncio.gather(*(worker(per) for _ in range(clients)))
        return (time.process_time() - t) / (per * clients) * 1e3
    finally:
        await close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/upstream-clients")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=1500)
    args = ap.parse_args()
    kinds = ["httpx", "httpx-aiohttp", "aiohttp"]
    try:
        import httpx_aiohttp  # noqa: F401
    except ImportError:
        kinds.remove("httpx-aiohttp")
    out = Path(args.out) if Path(args.out).is_absolute() else ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    stub = subprocess.Popen([sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v2/rerank"
    body = _body(100, 10)
    runs: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        import uvloop

        for rnd in range(args.rounds):
            for clients in (1, 32):
                for kind in kinds[rnd % len(kinds):] + kinds[: rnd % len(kinds)]:
                    ms = uvloop.run(_measure(kind, url, body, clients, args.calls))
                    runs.append({"round": rnd, "client": kind, "concurrency": clients, "cpu_ms_per_call": ms})
                    print(f"round {rnd} {kind:<14} c={clients:<2} {ms:.3f} ms CPU per call", flush=True)
    finally:
        stub.terminate()
        stub.wait(timeout=20)
    summary = {
        f"{k} c={c}": statistics.median(r["cpu_ms_per_call"] for r in runs if r["client"] == k and r["concurrency"] == c)
        for k in kinds for c in (1, 32)
    }
    loadavg = Path("/proc/loadavg").read_text().split()[:3]
    result = {"body_bytes": len(body), "calls": args.calls, "rounds": args.rounds, "loadavg_at_end": loadavg,
              "median_cpu_ms_per_call": summary, "runs": runs}
    (out / "upstream_clients.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
