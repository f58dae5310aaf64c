"""Closed-loop rerank load against a gateway, and the outcome of every request it sent."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.reliability.processes import KEY


def _docs(i: int) -> list[str]:
    return [f"document {i}-{j} about topic {j % 7}" for j in range(1 + i % 100)]


@dataclass
class Load:
    """Outcomes of a closed-loop load: (t since start, status or -1 when lost, latency, retry-after)."""

    outcomes: list[tuple[float, int, float, str | None]] = field(default_factory=list)
    start: float = 0.0
    marks: dict[str, float] = field(default_factory=dict)  # when each fault happened (``mark``)

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

    def mark(self, name: str) -> None:
        """A fault happens now: seconds since the load started, as ``marks[name]``."""
        self.marks[name] = time.monotonic() - self.start

    def first_ok_after(self, t: float) -> float | None:
        oks = [o[0] + o[2] for o in self.outcomes if o[1] == 200 and o[0] >= t]
        return round(min(oks) - t, 3) if oks else None


async def _load(
    url: str,
    clients: int,
    seconds: float,
    load: Load,
    *,
    model: str,
    key: str | None = KEY,
    request_timeout: float = 30.0,
    backoff_503: float = 0.1,
    until: Any = None,
) -> None:
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


def under_load(url: str, clients: int, seconds: float, faults: Any, load: Load | None = None, **kw: Any) -> Load:
    """``_load`` beside ``await faults(load)``, which marks when each fault happens (``Load.mark``)."""
    load = load or Load()

    async def run() -> None:
        await asyncio.gather(_load(url, clients, seconds, load, **kw), faults(load))

    asyncio.run(run())
    return load
