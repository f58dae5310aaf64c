"""The variants' run (engine_bench.json / .md) and the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.engine_bench.cpu_compare import cpu_compare
from benchmarks.engine_bench.measure import bench_variant, markdown, matmul_tflops
from benchmarks.engine_bench.variants import gateway_service_variant, raw_llm, raw_score_fns, seed_fn
from benchmarks.engine_bench.workload import (
    CLIENTS,
    SMALL_WORKLOADS,
    WARMUP,
    WORKLOADS,
    PromptLengths,
    Request,
    make_requests,
)

# The package's docstring is the benchmark's description (``--help`` shows it).
_SUITE_DOC = sys.modules[__package__].__doc__


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    tflops, device = matmul_tflops()
    print(f"matmul: {tflops:.1f} TFLOP/s on {device}", flush=True)
    lengths = PromptLengths(args.model)
    sizes = SMALL_WORKLOADS if args.small else WORKLOADS

    def requests_for(salt: int) -> dict[str, list[Request]]:
        return {wl: make_requests(args.model, wl, WARMUP + reps + CLIENTS * pc, args.small, salt)
                for wl, (_, _, reps, pc) in sizes.items()}

    rows: list[dict[str, Any]] = []
    variants = args.variants.split(",")
    extra = json.loads(args.engine_config) if args.engine_config else {}
    for kind in ("packed", "vllm-score", "vllm-generate", "transformers"):
        if kind in variants:
            _, score, stop = await gateway_service_variant(kind, args.model, extra.get(kind, {}))
            try:
                rows += await bench_variant(f"gateway service + {kind}", score, requests_for(len(rows)), lengths, cfg, tflops, args.small)
            finally:
                await stop()
    if {"raw-score", "seed"} & set(variants):
        llm = raw_llm(args.model, args.small, args.gpu_util)
        with ThreadPoolExecutor(CLIENTS) as pool:
            if "raw-score" in variants:
                single = ThreadPoolExecutor(1)  # the offline engine is not thread-safe
                score, batch = raw_score_fns(llm, single)
                rows += await bench_variant("raw LLM.score (text)", score, requests_for(len(rows)), lengths, cfg, tflops, args.small,
                                            batch_many=batch)
                single.shutdown()
            if "seed" in variants:
                rows += await bench_variant("seed design (lock, batches of 100)", seed_fn(llm, pool), requests_for(len(rows)),
                                            lengths, cfg, tflops, args.small)
        del llm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_bench.json").write_text(json.dumps({"tflops": tflops, "device": device, "rows": rows}, indent=1))
    (out / "engine_bench.md").write_text(markdown(rows, tflops, device))
    print(markdown(rows, tflops, device), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=_SUITE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="Qwen3-Reranker checkpoint directory (required unless --cpu-compare)")
    ap.add_argument("--cpu-compare", action="store_true", help="packed vs padded transformers on CPU (builds its models)")
    ap.add_argument("--cpu-models", default="tiny,0.6b-shape", help="--cpu-compare: which models")
    ap.add_argument("--work", default="/tmp/rr-cpu-compare", help="--cpu-compare: where the models are built")
    ap.add_argument("--variants", default="packed,vllm-score,vllm-generate,transformers,raw-score,seed")
    ap.add_argument("--engine-config", help='JSON: extra config per engine kind, e.g. {"vllm-score": {...}}')
    ap.add_argument("--gpu-util", type=float, default=0.3, help="raw LLM gpu_memory_utilization")
    ap.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    ap.add_argument("--out", default="bench-out/engine")
    args = ap.parse_args()
    if args.cpu_compare:
        asyncio.run(cpu_compare(Path(args.work), Path(args.out), args.cpu_models.split(",")))
    elif not args.model:
        ap.error("--model is required")
    else:
        asyncio.run(run(args))
