# Ad-hoc exploration script kept as the record of how the exploration figures in README.md were taken.
# Run from the repository root: python docs/benchmarks/cpu-2026-12-01-granian/<this file> ...
import asyncio
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.getcwd())
import aiohttp
import uvloop

from adapters.upstreams.http import make_session
from benchmarks.harness import free_port as _free_port
from benchmarks.passthrough_wrk import _body


def variants():
    base = {
        "connect_timeout_s": 5,
        "read_timeout_s": 60,
        "max_connections": 64,
        "headers": {"Content-Type": "application/json"},
    }

    def product():
        return make_session(**base)

    def no_sock_read():
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, limit_per_host=0, keepalive_timeout=30),
            headers=base["headers"],
            timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_connect=5, sock_read=None),
            trust_env=False,
        )

    def lean_headers():
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, limit_per_host=0, keepalive_timeout=30),
            headers=base["headers"],
            timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_connect=5, sock_read=60),
            trust_env=False,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )

    return {"product": product, "no-sock-read": no_sock_read, "lean-headers": lean_headers}


async def measure(make, url, body, clients, calls):
    s = make()

    async def one():
        async with s.post(url, data=body) as r:
            await r.read()

    for _ in range(50):
        await one()
    n = calls // clients
    t0 = time.process_time()

    async def worker():
        for _ in range(n):
            await one()

    await asyncio.gather(*(worker() for _ in range(clients)))
    cpu = (time.process_time() - t0) / (n * clients) * 1e3
    await s.close()
    return cpu


port = _free_port()
stub = subprocess.Popen([sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(port)])
time.sleep(3)
url = f"http://127.0.0.1:{port}/v2/rerank"
body = _body(100, 10)
res = {}
try:
    for rnd in range(4):
        for c in (1, 32):
            for name, make in variants().items():
                cpu = uvloop.run(measure(make, url, body, c, 1500))
                res.setdefault((name, c), []).append(cpu)
    for (name, c), xs in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"c={c:>2} {name:<14} median {statistics.median(xs):.3f} ms  all {[round(x, 3) for x in xs]}")
finally:
    stub.kill()
