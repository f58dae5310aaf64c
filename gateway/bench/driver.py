"""HTTP load drivers: closed loop (N concurrent clients), open loop (a request rate), and rounds
that alternate two endpoints (``--compare``).

Bodies are encoded before the clock starts; one ``httpx.AsyncClient`` with keep-alive
connections per endpoint. A request counts as OK when the status is 200 and the body holds the
expected number of results; anything else is recorded with its status (0 for a transport error
or a timeout), a short reason and the time it took, and counts in the report like any request.

Open loop measures latency from the request's *scheduled* send time, so a server that falls
behind shows its queueing in the latency instead of hiding it (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence

import httpx
import msgspec

from gateway.bench.workload import BenchRequest

__all__ = ("Endpoint", "LevelRun", "Sample", "run_closed", "run_compare", "run_open")


class Endpoint(msgspec.Struct, kw_only=True):
    label: str
    url: str
    headers: dict[str, str] = {}
    requests: list[BenchRequest] = []
    warmup: list[BenchRequest] = []


class Sample(msgspec.Struct, kw_only=True, array_like=True):
    start_s: float  # since the level began
    latency_s: float
    status: int  # 0: no HTTP response (connect error, timeout)
    ok: bool
    documents: int
    content_tokens: int
    server_tokens: int | None = None
    error: str | None = None
    # Server-side timing headers when the server sends them (ours does): where the time went.
    process_ms: float | None = None  # x-process-time-ms: request in -> response headers out
    tokenize_ms: float | None = None  # x-tokenize-time-ms
    inference_ms: float | None = None  # x-inference-time-ms
    # No answer within --timeout: latency_s is then the whole wait (at least the timeout), and the
    # request enters the latency distribution there -- the slowest of all, never left out.
    timed_out: bool = False


class LevelRun(msgspec.Struct, kw_only=True):
    """One endpoint at one load level: its samples and the wall time they took."""

    endpoint: str
    mode: str  # "closed" | "open"
    concurrency: int | None = None
    rate: float | None = None
    wall_s: float = 0.0
    samples: list[Sample] = []


class _Result(msgspec.Struct):
    index: int
    relevance_score: float


class _Tokens(msgspec.Struct):
    input_tokens: float | None = None


class _Meta(msgspec.Struct):
    tokens: _Tokens | None = None


class _Usage(msgspec.Struct):
    total_tokens: float | None = None


class _Reply(msgspec.Struct):
    results: list[_Result]
    meta: _Meta | None = None
    usage: _Usage | None = None


_decode_reply = msgspec.json.Decoder(_Reply).decode
_TIMING_HEADERS = (
    ("process_ms", "x-process-time-ms"),
    ("tokenize_ms", "x-tokenize-time-ms"),
    ("inference_ms", "x-inference-time-ms"),
)


def _header_ms(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


Progress = Callable[[Sample], None]


def make_client(concurrency: int, timeout: float) -> httpx.AsyncClient:
    conns = max(4, concurrency + 4)
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
        limits=httpx.Limits(max_connections=conns, max_keepalive_connections=conns),
        headers={"content-type": "application/json"},
    )


async def _send(client: httpx.AsyncClient, ep: Endpoint, req: BenchRequest, t_ref: float, t_sched: float) -> Sample:
    status, ok, error, tokens, timed_out = 0, False, None, None, False
    timing: dict[str, float | None] = {}
    try:
        resp = await client.post(ep.url, content=req.body, headers=ep.headers)
        status = resp.status_code
        timing = {field: _header_ms(resp.headers.get(name)) for field, name in _TIMING_HEADERS}
        if status == 200:
            try:
                reply = _decode_reply(resp.content)
            except msgspec.DecodeError as exc:
                error = f"bad body: {str(exc)[:80]}"
            else:
                ok = len(reply.results) == req.expected_results
                if not ok:
                    error = f"{len(reply.results)} results, expected {req.expected_results}"
                if reply.meta and reply.meta.tokens and reply.meta.tokens.input_tokens is not None:
                    tokens = int(reply.meta.tokens.input_tokens)
                elif reply.usage and reply.usage.total_tokens is not None:
                    tokens = int(reply.usage.total_tokens)
        else:
            error = resp.text[:120]
    except httpx.TimeoutException as exc:
        timed_out = True
        error = f"{type(exc).__name__}: {str(exc)[:80]}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {str(exc)[:80]}"
    done = time.perf_counter()
    return Sample(
        start_s=t_sched - t_ref,
        latency_s=done - t_sched,
        status=status,
        ok=ok,
        documents=req.documents,
        content_tokens=req.content_tokens,
        server_tokens=tokens,
        error=error,
        timed_out=timed_out,
        **timing,
    )


async def _closed(
    client: httpx.AsyncClient,
    ep: Endpoint,
    requests: Sequence[BenchRequest],
    concurrency: int,
    progress: Progress | None,
) -> tuple[list[Sample], float]:
    samples: list[Sample] = []
    it = iter(requests)
    t_ref = time.perf_counter()

    async def worker() -> None:
        for req in it:  # a shared iterator: each request is sent exactly once
            t = time.perf_counter()
            sample = await _send(client, ep, req, t_ref, t)
            samples.append(sample)
            if progress:
                progress(sample)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return samples, time.perf_counter() - t_ref


def _cycle(requests: Sequence[BenchRequest], n: int) -> list[BenchRequest]:
    return [requests[i % len(requests)] for i in range(n)]


async def run_closed(
    ep: Endpoint, *, concurrency: int, total: int, timeout: float, progress: Progress | None = None
) -> LevelRun:
    async with make_client(concurrency, timeout) as client:
        if ep.warmup:
            await _closed(client, ep, _cycle(ep.warmup, max(len(ep.warmup), concurrency)), concurrency, None)
        samples, wall = await _closed(client, ep, _cycle(ep.requests, total), concurrency, progress)
    return LevelRun(endpoint=ep.label, mode="closed", concurrency=concurrency, wall_s=wall, samples=samples)


async def run_open(
    ep: Endpoint,
    *,
    rate: float,
    total: int,
    timeout: float,
    max_in_flight: int = 1024,
    poisson: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
) -> LevelRun:
    """Send ``total`` requests at ``rate`` per second (fixed spacing, or Poisson arrivals)."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(max_in_flight)
    samples: list[Sample] = []
    async with make_client(min(max_in_flight, 256), timeout) as client:
        if ep.warmup:
            await _closed(client, ep, ep.warmup, 1, None)

        async def one(req: BenchRequest, t_ref: float, t_sched: float) -> None:
            async with gate:  # waiting here counts as latency: it is queueing the client saw
                sample = await _send(client, ep, req, t_ref, t_sched)
            samples.append(sample)
            if progress:
                progress(sample)

        tasks: list[asyncio.Task[None]] = []
        t_ref = time.perf_counter()
        offset = 0.0
        for req in _cycle(ep.requests, total):
            t_sched = t_ref + offset
            delay = t_sched - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req, t_ref, t_sched)))
            offset += rng.expovariate(rate) if poisson else 1.0 / rate
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t_ref
    return LevelRun(endpoint=ep.label, mode="open", rate=rate, wall_s=wall, samples=samples)


async def run_compare(
    a: Endpoint,
    b: Endpoint,
    *,
    concurrency: int,
    total: int,
    round_size: int,
    timeout: float,
    progress: Progress | None = None,
) -> tuple[LevelRun, LevelRun]:
    """Alternate the endpoints in rounds of ``round_size`` requests (ABBA order).

    Each round sends the same requests to both, one endpoint after the other, at the same
    concurrency; an endpoint's throughput is its requests over the sum of its rounds' wall
    time. Slow drifts of the machine (other load, clocks, thermals) hit both alike.
    """
    runs = {
        a.label: LevelRun(endpoint=a.label, mode="closed", concurrency=concurrency),
        b.label: LevelRun(endpoint=b.label, mode="closed", concurrency=concurrency),
    }
    async with make_client(concurrency, timeout) as ca, make_client(concurrency, timeout) as cb:
        clients = {a.label: ca, b.label: cb}
        for ep in (a, b):
            if ep.warmup:
                await _closed(
                    clients[ep.label], ep, _cycle(ep.warmup, max(len(ep.warmup), concurrency)), concurrency, None
                )
        reqs = {ep.label: _cycle(ep.requests, total) for ep in (a, b)}
        t_ref = time.perf_counter()
        for k, start in enumerate(range(0, total, round_size)):
            order = (a, b) if k % 2 == 0 else (b, a)
            for ep in order:
                run = runs[ep.label]
                samples, wall = await _closed(
                    clients[ep.label], ep, reqs[ep.label][start : start + round_size], concurrency, progress
                )
                shift = time.perf_counter() - wall - t_ref  # keep start times on one clock
                run.samples.extend(msgspec.structs.replace(s, start_s=s.start_s + shift) for s in samples)
                run.wall_s += wall
    return runs[a.label], runs[b.label]
