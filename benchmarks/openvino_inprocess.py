"""The openvino engine in-process (no HTTP, no client on the wire): 1 client vs 4 concurrent
``score`` calls, rounds alternating which goes first; docs/s and docs per CPU-second of this
process; the engine's counters at the end. Prints one JSON line.

Run from a checkout to measure its code; for an older commit, from an extracted copy:

    git archive <commit> | tar -x -C /tmp/old && cd /tmp/old && python /path/to/openvino_inprocess.py ...
    python -m benchmarks.openvino_inprocess --model DIR --docs 50 --rounds 3 [--batching shared]

``--model``: a cross-encoder checkpoint (e.g. the one ``benchmarks.cpu_encoders`` builds for
the ``minilm`` shape); the export cache is ``DIR/../ov-cache``.
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

sys.path.insert(0, os.getcwd())  # the checkout this is run from, not this file's

from adapters.base import ScoreJob  # noqa: E402
from adapters.runtimes.cpu.engine import OpenVinoEngine  # noqa: E402
from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter  # noqa: E402
from schemas.config import OpenVinoEngineConfig  # noqa: E402


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = Path(args.model)
    spec = WorkloadSpec(requests=8, documents=args.docs, doc_tokens="60-140", query_tokens="10", seed=7)
    reqs = [(b["query"], b["documents"]) for b in (msgspec.json.decode(r.body) for r in build_workload(spec, load_token_counter(str(model))))]
    extra = {"batching": args.batching} if args.batching else {}
    engine = OpenVinoEngine(OpenVinoEngineConfig(name="m", path=str(model), cache_dir=str(model.parent / "ov-cache"), **extra))
    await engine.start()
    tok = engine.tokenizer
    assert tok is not None

    def job(q: str, docs: list[str]) -> ScoreJob:
        shared = tok.encode_shared(q, "")
        room = tok.item_room(shared)
        return ScoreJob(query=q, instruction="", shared_ids=shared, item_ids=[i[:room] for i in tok.encode_documents(docs)], raw_scores=False)

    jobs = [job(q, d) for q, d in reqs]
    await engine.score(jobs[0])
    n = max(4, 200 // args.docs)  # requests per measurement (~200 documents)
    runs = []
    for r in range(args.rounds):
        for clients in ((1, 4) if r % 2 == 0 else (4, 1)):
            async def client(k: int, clients: int = clients) -> None:
                for i in range(n // clients):
                    await engine.score(jobs[(k + i) % len(jobs)])

            cpu, started = time.process_time(), time.perf_counter()
            await asyncio.gather(*(client(k) for k in range(clients)))
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            docs = (n // clients) * clients * args.docs
            runs.append({"round": r, "clients": clients, "docs_s": docs / wall, "docs_cpu_s": docs / cpu, "load": os.getloadavg()[0]})
    stats = engine.stats()
    await engine.stop()
    return {"docs": args.docs, "batching": args.batching or "(code default)", "stats": stats, "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--docs", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batching", default="", help='"shared" or "per-request" (omit for code without the key)')
    print(json.dumps(asyncio.run(run(p.parse_args()))))


if __name__ == "__main__":
    main()
