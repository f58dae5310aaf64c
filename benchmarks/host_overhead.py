"""The packed engine's host-side time around its forward, per request, through the rerank service.

    python -m benchmarks.host_overhead [--requests 40] [--rounds 2]

In one process, no HTTP: the tiny XLM-R of ``benchmarks.gpu_encoders --tiny`` served by the
``packed`` engine on CPU, driven through ``RerankService.rerank`` with ``gateway bench``'s d100
workload (1 query x 100 documents of 60-200 tokens), one request at a time. The replica runs as
on CUDA (``pipelined``: launch, then collect), and its ``launch`` and ``collect`` are timed; on
CPU the forward itself is slow and noisy, so what is reported is the time *around* it:

- ``overhead``: the whole ``rerank`` call minus the replica's launch + collect;
- ``tokenize``: the service's tokenize phase (tokenizing, truncation, chunking);
- ``handoff``: the inference phase minus launch + collect (submit, worker wake-up, assembling
  the step, results back to the event loop, the family's score rule, checks);
- ``after``: ranking and building the response (the call minus both phases).

p50 and p99 of each, in ms, over ``--rounds`` runs; ``--label`` names the run in the JSON so
runs of different checkouts can be put side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.gpu_encoders import COMMON, DOC_TOKENS, DOCS, QUERY_TOKENS, TINY_CONFIG, build


def _pct(values: list[float]) -> dict[str, float]:
    from gateway.bench.report import percentile

    v = sorted(values)
    return {"p50": percentile(v, 50), "p99": percentile(v, 99), "mean": sum(v) / len(v)}


async def run(model_dir: Path, requests: int, rounds: int) -> dict[str, Any]:
    from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter
    from gateway.serving.models import ModelRegistry
    from gateway.serving.service import RerankService
    from schemas.config import Settings
    from schemas.rerank import RerankRequest

    settings = msgspec.convert({"models": [{"name": "packed", "path": str(model_dir), **COMMON, "engine": "packed",
                                            "devices": ["cpu"], "batch_tokens": 65536}]}, Settings)
    registry = ModelRegistry(settings)
    rt = registry.get("packed")
    await rt.load()
    engine: Any = rt.engine
    (replica,) = engine._replicas
    replica.pipelined = True  # the CUDA flow: launch (host prep + queued kernels), then collect
    spent = [0.0]
    launch, collect = replica.launch, replica.collect

    def timed(fn: Any) -> Any:
        def inner(*a: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[0] += time.perf_counter() - t
        return inner

    replica.launch, replica.collect = timed(launch), timed(collect)
    # the scheduler read ``pipelined`` when its worker started: start a fresh one
    from adapters.runtimes.packed.scheduler import PackedScheduler

    engine._scheduler.stop()
    engine._scheduler = PackedScheduler([replica], batch_tokens=65536, max_items=settings.models[0].max_items_per_step,
                                        error_type=RuntimeError)
    service = RerankService(registry, settings.limits)
    spec = WorkloadSpec(requests=requests, documents=DOCS, doc_tokens=DOC_TOKENS, query_tokens=QUERY_TOKENS, seed=3,
                        model="packed")
    bodies = [msgspec.json.decode(r.body, type=RerankRequest) for r in build_workload(spec, load_token_counter(str(model_dir)))]
    for body in bodies[:3]:  # warm-up
        await service.rerank(body, api_version="1", request_id="w")
    rows: dict[str, list[float]] = {"total": [], "forward": [], "overhead": [], "tokenize": [], "handoff": [], "after": []}
    for _ in range(rounds):
        for body in bodies:
            spent[0] = 0.0
            t = time.perf_counter()
            out = await service.rerank(body, api_version="1", request_id="r")
            total = 1e3 * (time.perf_counter() - t)
            fwd = 1e3 * spent[0]
            rows["total"].append(total)
            rows["forward"].append(fwd)
            rows["overhead"].append(total - fwd)
            rows["tokenize"].append(out.tokenize_ms)
            rows["handoff"].append(out.inference_ms - fwd)
            rows["after"].append(total - out.tokenize_ms - out.inference_ms)
    await registry.stop()
    return {k: _pct(v) for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--label", default="")
    ap.add_argument("--work", default="/tmp/rr-host-overhead")
    args = ap.parse_args()
    model_dir = Path(args.work) / "xlmr-tiny"
    if not (model_dir / "config.json").exists():
        model_dir.parent.mkdir(parents=True, exist_ok=True)
        build(model_dir, TINY_CONFIG, "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    for round_ in range(args.rounds):
        res = asyncio.run(run(model_dir, args.requests, 1))
        doc = {"label": args.label, "round": round_, "load_average": os.getloadavg(), "python": sys.version.split()[0],
               "ms": res}
        print(json.dumps(doc))
        for k, v in res.items():
            print(f"{args.label:>8} round {round_} {k:>9}: p50 {v['p50']:7.2f}  p99 {v['p99']:7.2f}  "
                  f"mean {v['mean']:7.2f} ms", file=sys.stderr)


if __name__ == "__main__":
    main()
