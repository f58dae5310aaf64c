"""A closed-loop HTTP client for machines without wrk: ``--client python`` runs this in its own process.

    python -m benchmarks.passthrough_wrk.pyclient URL BODY_FILE CLIENTS SECONDS

``CLIENTS`` aiohttp tasks post ``BODY_FILE`` back to back on keep-alive connections; one JSON line
in :func:`benchmarks.passthrough_wrk.wrk.parse_wrk`'s shape. It costs more client CPU than wrk:
compare targets measured with the same client only.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

__all__ = ("run",)


def _pct(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))] if sorted_ms else float("nan")


async def run(url: str, body: bytes, clients: int, seconds: float, timeout_s: float = 10.0) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        end = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal errors
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                        ok = response.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - t0) * 1e3)
                else:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "req_s": len(latencies) / elapsed,
        "p50_ms": _pct(latencies, 0.50),
        "p90_ms": _pct(latencies, 0.90),
        "p99_ms": _pct(latencies, 0.99),
        "errors": errors,
    }


def main() -> None:
    url, body_file, clients, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    with open(body_file, "rb") as f:
        body = f.read()
    print(json.dumps(asyncio.run(run(url, body, clients, seconds))))


if __name__ == "__main__":
    main()
