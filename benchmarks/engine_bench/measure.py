"""One variant measured: sequential and concurrent clients per workload, a row of docs/s, tokens/s
and MFU against the matmul rate measured here; the rows as a markdown table.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.engine_bench.workload import (
    CLIENTS,
    SMALL_WORKLOADS,
    WARMUP,
    WORKLOADS,
    PromptLengths,
    Request,
    ScoreFn,
    flops_per_prompt,
)
from gateway.bench.report import percentile


def matmul_tflops() -> tuple[float, str]:
    """Median dense matmul rate of this device (what MFU is measured against)."""
    import torch

    if torch.cuda.is_available():
        n, dtype, dev = 8192, torch.bfloat16, "cuda"
    else:
        n, dtype, dev = 1024, torch.float32, "cpu"
    a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    times = []
    for i in range(25):
        if dev == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            a @ b
            e1.record()
            e1.synchronize()
            dt = e0.elapsed_time(e1) / 1e3
        else:
            t = time.perf_counter()
            a @ b
            dt = time.perf_counter() - t
        if i >= 5:
            times.append(dt)
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    return 2 * n**3 / statistics.median(times) / 1e12, f"{name} {str(dtype).replace('torch.', '')} {n}^3"


async def bench_variant(
    name: str,
    score: ScoreFn,
    requests: dict[str, list[Request]],
    lengths: PromptLengths,
    cfg: dict[str, Any],
    tflops: float,
    small: bool = False,
    batch_score: ScoreFn | None = None,
    batch_many: Callable[[list[Request]], Awaitable[None]] | None = None,
) -> list[dict[str, Any]]:
    """Alone (sequential) and 16 clients, per workload. ``batch_many`` replaces concurrent
    clients for offline engines (one call holding all 16 requests)."""
    rows = []
    timings = getattr(score, "timings", None)  # gateway service: (tokenize ms, inference ms) per request

    def split(since: int) -> dict[str, float] | None:
        new = timings[since:] if timings is not None else []
        if not new:
            return None
        return {"tokenize_ms": sum(a for a, _ in new) / len(new), "inference_ms": sum(b for _, b in new) / len(new)}

    for wl, reqs in requests.items():
        _, _, reps, per_client = (SMALL_WORKLOADS if small else WORKLOADS)[wl]
        for r in reqs[:WARMUP]:
            await score(r)
        seq = reqs[WARMUP : WARMUP + reps]
        mark = len(timings) if timings is not None else 0
        lat = []
        for r in seq:
            t = time.perf_counter()
            scores = await score(r)
            lat.append(time.perf_counter() - t)
            if len(scores) != len(r[1]) or not all(0.0 <= s <= 1.0 for s in scores):
                raise RuntimeError(f"{name}: bad scores {scores[:5]}...")
        rows.append(_row(name, wl, "alone", seq, lat, sum(lat), lengths, cfg, tflops) | {"service_split": split(mark)})
        mark = len(timings) if timings is not None else 0
        conc = reqs[WARMUP + reps : WARMUP + reps + CLIENTS * per_client]
        clat: list[float] = []
        t0 = time.perf_counter()
        if batch_many is not None:
            for k in range(per_client):
                t = time.perf_counter()
                await batch_many(conc[k * CLIENTS : (k + 1) * CLIENTS])
                clat += [time.perf_counter() - t] * CLIENTS
            mode = f"{CLIENTS} requests per call"
        else:

            async def client(mine: list[Request], out: list[float]) -> None:
                for r in mine:
                    t = time.perf_counter()
                    await score(r)
                    out.append(time.perf_counter() - t)

            await asyncio.gather(*(client(conc[i::CLIENTS], clat) for i in range(CLIENTS)))
            mode = f"{CLIENTS} clients"
        rows.append(
            _row(name, wl, mode, conc, clat, time.perf_counter() - t0, lengths, cfg, tflops)
            | {"service_split": split(mark)}
        )
        print(
            json.dumps({k: rows[-2][k] for k in ("variant", "workload", "load", "docs_per_s", "p50_ms")}),
            json.dumps({k: rows[-1][k] for k in ("variant", "workload", "load", "docs_per_s", "mfu")}),
            flush=True,
        )
    return rows


def _row(
    name: str,
    wl: str,
    load: str,
    reqs: list[Request],
    lat: list[float],
    wall: float,
    lengths: PromptLengths,
    cfg: dict[str, Any],
    tflops: float,
) -> dict[str, Any]:
    prompt_lens = [n for r in reqs for n in lengths.of(r)]
    flops = sum(flops_per_prompt(n, cfg) for n in prompt_lens)
    lat_ms = sorted(x * 1e3 for x in lat)
    return {
        "variant": name,
        "workload": wl,
        "load": load,
        "requests": len(reqs),
        "wall_s": wall,
        "docs_per_s": sum(len(r[1]) for r in reqs) / wall,
        "tokens_per_s": sum(prompt_lens) / wall,
        "tflop_per_s": flops / wall / 1e12,
        "mfu": flops / wall / 1e12 / tflops,
        "p50_ms": percentile(lat_ms, 50),
        "p99_ms": percentile(lat_ms, 99),
        "max_ms": lat_ms[-1],
        "prompt_tokens_per_request": sum(prompt_lens) / len(reqs),
        "shared_prefix_tokens": lengths.shared(reqs[0]),
    }


def markdown(rows: list[dict[str, Any]], tflops: float, device: str) -> str:
    lines = [
        f"Matmul rate measured here: {tflops:,.2f} TFLOP/s ({device}); MFU = model FLOPs / that rate.",
        "",
        "| variant | workload | load | docs/s | tokens/s | MFU | p50 ms | p99 ms | prompt tokens/request | tokenize / engine ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sp = r.get("service_split")
        split = f"{sp['tokenize_ms']:.1f} / {sp['inference_ms']:.1f}" if sp else "–"
        lines.append(
            f"| {r['variant']} | {r['workload']} | {r['load']} | {r['docs_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
            f"{100 * r['mfu']:.1f} % | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['prompt_tokens_per_request']:,.0f} | {split} |"
        )
    return "\n".join(lines) + "\n"
