"""The run: the checkpoint, then each phase asked for while the deadline allows, results saved
after every phase; and the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_suite.gateway_phase import phase_gateway
from benchmarks.gpu_suite.parity import phase_parity
from benchmarks.gpu_suite.plan import (
    GPU_ENGINES,
    REAL_CONFIG,
    SIZES,
    SMALL_ENGINES,
    build_checkpoint,
    left,
    log,
    matmul_tflops,
    tflop_per_doc,
)
from benchmarks.gpu_suite.report import report
from benchmarks.gpu_suite.two_gpu import (
    LARGE_REQUESTS,
    TWO_GPU_LEVELS,
    two_gpu_contestants,
    two_gpu_ratios,
    two_gpu_row,
)

# The package's docstring is the run's description (``--help`` shows it).
_SUITE_DOC = sys.modules[__package__].__doc__


async def main_async(args: argparse.Namespace) -> None:
    out_dir = Path(os.environ.get("OUT") or args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: dict[str, Any] = {"skipped": [], "errors": {}}
    from gateway.bench.report import environment

    results["environment"] = environment()
    t = time.time()
    model_dir = build_checkpoint(work / "qwen3rr", args.small)
    log(f"checkpoint in {time.time() - t:.0f}s")
    cfg = json.loads((model_dir / "config.json").read_text())
    tflops, device = matmul_tflops()
    results.update(tflops=tflops, device=device, model_config={k: cfg.get(k) for k in REAL_CONFIG})
    results["tflop_per_doc"] = tflop_per_doc(model_dir, args.small, cfg)
    log(f"matmul {tflops:.0f} TFLOP/s on {device}")
    engine_cfg = (
        json.loads(args.engine_config) if args.engine_config else (SMALL_ENGINES if args.small else GPU_ENGINES)
    )
    results["engine_config"] = engine_cfg

    def save() -> None:
        (out_dir / "gpu_results.json").write_text(json.dumps(results, indent=1, default=str))
        (out_dir / "gpu_report.md").write_text(report(results))

    async def phase(name: str, need_s: float, coro_fn: Any) -> Any:
        if left() < need_s:
            results["skipped"].append(f"{name}: {left():.0f}s left, needs ~{need_s:.0f}s")
            log("SKIP", results["skipped"][-1])
            return None
        t0 = time.time()
        try:
            return await coro_fn()
        except Exception as exc:  # one failed variant must not lose the others' results  # noqa: BLE001
            results["errors"][name] = f"{type(exc).__name__}: {exc}"[:2000]
            log(f"ERROR in {name}: {results['errors'][name]}")
            return None
        finally:
            log(f"{name} took {time.time() - t0:.0f}s")
            save()

    phases = args.phases.split(",")
    kinds = args.http_engines.split(",")
    gw: dict[str, Any] = {"start_s": {}, "http": {}, "engine_stats": {}}
    if "parity" in phases:
        results["parity"] = await phase(
            "parity (packed and transformers vs the reference)", 60, lambda: phase_parity(model_dir, work, args.small)
        )
    if "twogpu" in phases:
        import torch

        n_gpu = torch.cuda.device_count()
        if not args.small and n_gpu < 2:
            results["skipped"].append(f"two GPUs: this machine has {n_gpu}")
        else:
            two: dict[str, Any] = {"size": "tiny (CPU devices)" if args.small else args.twogpu_size}
            two_dir, reqs2 = model_dir, None
            if args.twogpu_size != "0.6b" and not args.small:
                two_dir = await asyncio.to_thread(
                    build_checkpoint, work / f"qwen3-{args.twogpu_size}", False, SIZES[args.twogpu_size]
                )
                reqs2 = LARGE_REQUESTS
            for label, over in two_gpu_contestants(args.small):
                if torch.cuda.is_available():
                    for i in range(n_gpu):
                        torch.cuda.reset_peak_memory_stats(i)
                one = await phase(
                    f"two GPUs: {label}",
                    90,
                    lambda label=label, over=over: phase_gateway(
                        two_dir,
                        "packed",
                        {**engine_cfg.get("packed", {}), **over},
                        work,
                        args.small,
                        label=label,
                        levels=TWO_GPU_LEVELS,
                        requests=reqs2,
                    ),
                )
                if one:
                    two[label] = two_gpu_row(one, label)
            two.update(two_gpu_ratios(two))
            results["two_gpu"] = two
    # One gateway per engine kind, one after the other: two vLLM engines starting together on
    # one GPU each count the other's memory as taken, and the second finds no room for KV cache.
    for kind in kinds if "gateway" in phases else []:
        one = await phase(
            f"gateway {kind} (HTTP)",
            150,
            lambda kind=kind: phase_gateway(model_dir, kind, engine_cfg.get(kind, {}), work, args.small),
        )
        if one:
            gw["start_s"][kind] = one["start_s"]
            gw["http"].update(one["http"])
            gw["engine_stats"][kind] = one.get("engine_stats")
            if "parity_0.6b_via_gateway" in one:
                results.setdefault("parity_via_gateway", {})[kind] = one["parity_0.6b_via_gateway"]
            results["gateway"] = gw
    if gw["http"]:
        for kind in list(gw["http"])[:2]:  # 4 plots at most: the device returns 8 files
            for png in ("latency_cdf.png", "throughput.png"):
                src = work / f"http-{kind}-d100-c16" / png
                if src.exists():
                    shutil.copy(src, out_dir / f"{kind}_d100_{png}")

    save()
    log("done; results in", out_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=_SUITE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/gpu")
    ap.add_argument("--work", default="/tmp/rr-suite")
    ap.add_argument("--small", action="store_true", help="tiny model on CPU: a smoke test of this script")
    ap.add_argument("--phases", default="parity,gateway,twogpu", help="which phases to run")
    ap.add_argument(
        "--twogpu-size",
        default="0.6b",
        choices=("0.6b", "4b", "8b"),
        help="the model shape of phase twogpu (4b/8b: Qwen3-Reranker-4B / -8B's configs, random weights)",
    )
    ap.add_argument(
        "--http-engines",
        default="packed,vllm-score,vllm-generate",
        help="engine kinds the HTTP gateway serves, one gateway each (comma list)",
    )
    ap.add_argument(
        "--engine-config",
        default=os.environ.get("RR_ENGINE_CONFIG"),
        help='JSON per engine kind, e.g. {"vllm-score": {"gpu_memory_utilization": 0.3}}',
    )
    asyncio.run(main_async(ap.parse_args()))
