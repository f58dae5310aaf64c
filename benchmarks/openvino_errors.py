"""Where a reduced precision's error lies, and what refinement re-scores: one engine in-process
(no HTTP), its fp32 and reduced models scoring the same sets, raw outputs (logits) compared.

Prints one JSON object: per set (the gate's golden queries, the calibration queries, ``--extra``
more generated queries, the benchmark's workload) the error's size overall and by fp32 logit and
by row length, how much a per-query shift would take out, and the share of documents each
``refine_rounds`` re-scores with the engine's bound (keeping fp32's top-10 order, checked).

    python -m benchmarks.openvino_errors --model DIR [--precision bf16] [--extra 96]

``--model``: a cross-encoder checkpoint (e.g. ``tests.real_minilm.build_minilm_reranker``'s);
the export cache is ``DIR/../ov-cache``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, os.getcwd())  # the checkout this is run from, not this file's

from adapters.runtimes.cpu.engine import OpenVinoEngine  # noqa: E402
from adapters.runtimes.parity import GoldenQuery, generate_golden_set, keeps_top_k  # noqa: E402
from adapters.runtimes.cpu.refine import refine, refine_space  # noqa: E402
from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter  # noqa: E402
from schemas.config import OpenVinoEngineConfig  # noqa: E402


def _bins(err: np.ndarray, key: np.ndarray, edges: list[float]) -> list[dict[str, Any]]:
    out = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        m = (key >= lo) & (key < hi)
        if m.any():
            out.append({"from": lo, "to": hi, "n": int(m.sum()), "max": float(err[m].max()), "p90": float(np.quantile(err[m], 0.9))})
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = Path(args.model)
    engine = OpenVinoEngine(OpenVinoEngineConfig(name="m", path=str(model), cache_dir=str(model.parent / "ov-cache"),
                                                 precision=args.precision, refine_top=10, parity_min_agreement=0.001))
    await engine.start()
    family = engine._family
    assert family is not None and engine._exact is not None
    vocab = family.tokenizer.vocab
    # The serving requests belong to the batcher's workers: the reduced model gets requests of its own.
    reduced: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for _ in range(engine.streams):
        reduced.put(engine._compiled.create_infer_request())
    spec = WorkloadSpec(requests=8, documents=50, doc_tokens="60-140", query_tokens="10", seed=7)
    bench = [GoldenQuery(b["query"], b["documents"]) for b in (msgspec.json.decode(r.body) for r in build_workload(spec, load_token_counter(str(model))))]
    sets = {
        "golden": generate_golden_set(vocab, queries=32, documents=30, seed=20),
        "calibration": generate_golden_set(vocab, queries=8, documents=30, seed=21),
        "extra": generate_golden_set(vocab, queries=args.extra, documents=30, seed=22),
        "workload": bench,
    }
    tie = engine._config.parity_tie
    out: dict[str, Any] = {"precision": args.precision, "delta": engine._delta}
    for name, golden in sets.items():
        fp32, red, lengths, shares = [], [], [], {1: 0, 2: 0, 3: 0}
        kept = {1: 0, 2: 0, 3: 0}
        for job, rows in engine._golden_rows(golden):
            space, to_score = refine_space(family, job)
            f = family.scores(space, engine._infer_all(rows, engine._exact))
            r = family.scores(space, engine._infer_all(rows, reduced))
            fp32.append(f), red.append(r), lengths.extend(len(x.ids) for x in rows)
            for rounds in shares:
                values, n = refine(r, delta=engine._delta, top=10, exact=lambda ix, f=f: [f[i] for i in ix], rounds=rounds,
                                   tied=lambda lo, hi, to=to_score: to(hi) - to(lo) < tie)
                shares[rounds] += n
                kept[rounds] += keeps_top_k([to_score(x) for x in f], [to_score(x) for x in values], tie=tie)
        f_all, r_all = np.concatenate(fp32), np.concatenate(red)
        err = np.abs(r_all - f_all)
        resid = np.concatenate([(np.array(r) - f) - (np.array(r) - f).mean() for f, r in zip(fp32, red, strict=True)])
        out[name] = {
            "documents": len(err), "max": float(err.max()), "median": float(np.median(err)), "p99": float(np.quantile(err, 0.99)),
            "max_after_per_query_shift": float(np.abs(resid).max()),
            "by_fp32_logit": _bins(err, f_all, [-100, -6, -3, 0, 3, 6, 100]),
            "by_length": _bins(err, np.array(lengths), [0, 80, 110, 140, 10_000]),
            "refined_share": {r: shares[r] / len(err) for r in shares},
            "queries_kept": {r: f"{kept[r]}/{len(fp32)}" for r in kept},
        }
    await engine.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--precision", default="bf16", choices=["bf16", "int8"])
    p.add_argument("--extra", type=int, default=96, help="more generated queries (30 documents each)")
    print(json.dumps(asyncio.run(run(p.parse_args()))))


if __name__ == "__main__":
    main()
