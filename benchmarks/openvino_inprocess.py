"""The openvino engine in-process (no HTTP, no client on the wire): 1 client vs 4 concurrent
``score`` calls, rounds alternating which goes first; docs/s and docs per CPU-second of this
process; the engine's counters at the end. Prints one JSON line.

Run from a checkout to measure its code; for an older commit, from an extracted copy:

    git archive <commit> | tar -x -C /tmp/old && cd /tmp/old && python /path/to/openvino_inprocess.py ...
    python -m benchmarks.openvino_inprocess --model DIR --docs 50 --rounds 3 [--batching shared]
    python -m benchmarks.openvino_inprocess --model DIR --clients 1 --rounds 4 \
        --variant '{"precision": "bf16", "refine_top": 10, "refine_rounds": 1}' \
        --variant '{"precision": "bf16", "refine_top": 10, "refine_rounds": 2}'

``--variant`` (repeatable): config keys of one engine; several are started in one process and
measured in turn each round (the order rotating), so they see the same load.

``--model``: a cross-encoder checkpoint (e.g. the one ``benchmarks.cpu_encoders`` builds for
the ``minilm`` shape); the export cache is ``DIR/../ov-cache``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, os.getcwd())  # the checkout this is run from, not this file's

from adapters.base import ScoreJob  # noqa: E402
from adapters.runtimes.cpu.engine import OpenVinoEngine  # noqa: E402
from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter  # noqa: E402
from schemas.config import OpenVinoEngineConfig  # noqa: E402


async def measure(engine: OpenVinoEngine, jobs: list[ScoreJob], clients: int, n: int, docs_per: int) -> dict[str, float]:
    async def client(k: int) -> None:
        for i in range(n // clients):
            await engine.score(jobs[(k + i) % len(jobs)])

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    docs = (n // clients) * clients * docs_per
    return {"docs_s": docs / wall, "docs_cpu_s": docs / cpu, "load": os.getloadavg()[0]}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = Path(args.model)
    spec = WorkloadSpec(requests=8, documents=args.docs, doc_tokens="60-140", query_tokens="10", seed=7)
    reqs = [(b["query"], b["documents"]) for b in (msgspec.json.decode(r.body) for r in build_workload(spec, load_token_counter(str(model))))]
    extra = {"batching": args.batching} if args.batching else {}
    variants = [json.loads(v) for v in args.variant] or [{}]
    engines = []
    for v in variants:
        config = {"name": "m", "path": str(model), "cache_dir": str(model.parent / "ov-cache"), **extra, **v}
        engine = OpenVinoEngine(msgspec.convert(config, OpenVinoEngineConfig))
        await engine.start()
        engines.append(engine)
    tok = engines[0].tokenizer
    assert tok is not None

    def job(q: str, docs: list[str]) -> ScoreJob:
        shared = tok.encode_shared(q, "")
        room = tok.item_room(shared)
        return ScoreJob(query=q, instruction="", shared_ids=shared, item_ids=[i[:room] for i in tok.encode_documents(docs)], raw_scores=False)

    jobs = [job(q, d) for q, d in reqs]
    for engine in engines:
        await engine.score(jobs[0])
    n = max(4, 200 // args.docs)  # requests per measurement (~200 documents)
    clients = [int(c) for c in args.clients.split(",")]
    runs = []
    for r in range(args.rounds):
        order = list(range(len(engines)))
        order = order[r % len(order):] + order[: r % len(order)]
        for v in order:
            for c in (clients if r % 2 == 0 else clients[::-1]):
                runs.append({"round": r, "variant": v, "clients": c, **await measure(engines[v], jobs, c, n, args.docs)})
    out = []
    for v, engine in enumerate(engines):
        mine = [x for x in runs if x["variant"] == v]
        summary = {c: statistics.median(x["docs_s"] for x in mine if x["clients"] == c) for c in clients}
        out.append({"config": variants[v], "median_docs_s": summary, "describe": engine.describe(), "stats": engine.stats()})
        await engine.stop()
    return {"docs": args.docs, "batching": args.batching or "(code default)", "variants": out, "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--docs", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batching", default="", help='"shared" or "per-request" (omit for code without the key)')
    p.add_argument("--variant", action="append", default=[], help="JSON object of config keys (repeatable)")
    p.add_argument("--clients", default="1,4", help="client counts measured each round")
    print(json.dumps(asyncio.run(run(p.parse_args()))))


if __name__ == "__main__":
    main()
