"""``python -m benchmarks.gpu_suite host``: the host's share of one idle d100 request, on the CPU.

The GPU runs (``encoders.py``) time a request over HTTP; the server's phase headers say how long
it tokenized, not where that time went. This profiles the host path alone, phase by phase, with
no device: the bge-reranker-v2-m3 tokenizer the suite builds (``encoder_checkpoint.build``, XLM-R
Unigram, 250k pieces, no weights) and the suite's own d100 requests (``DOC_TOKENS``). Each phase
runs the gateway's own code on the request's data:

``decode`` the HTTP body into the request; ``texts`` rank texts and dedup; ``shared`` the query's
ids; ``rust`` the documents' ``encode_batch`` (Rust), ``ids`` their ids as Python lists; ``job``
``token_job`` whole (what the request waits for when it is not submitted in parts); ``loop``
``token_job`` on ids already made (its worker-thread hop and per-document loop); ``part1``
``token_job`` on the first overlap part (what the device waits for before its first step);
``pack`` the scheduler's prompts and a step's host tensor (``_assemble``, ``_pack``); ``scores``
the head's logits to scores and the max over chunks; ``rank`` the sort and results; ``encode``
the response's JSON. ``--threads`` A/Bs the tokenizer's split (``tokenize_threads``),
interleaved request by request, as the suite compares runtimes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ("main", "profile")


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


class _Cached:
    """The pair tokenizer with its ids already made: ``token_job`` less the tokenizing."""

    def __init__(self, pair: Any, shared: list[int], ids: list[list[int]]) -> None:
        self._pair, self._shared, self._ids = pair, shared, ids
        self.max_length = pair.max_length

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        return self._shared

    def encode_documents(self, documents: Any) -> list[list[int]]:
        return self._ids

    def item_room(self, shared: Any) -> int:
        return int(self._pair.item_room(shared))


def profile(model_dir: Path, requests: int, variants: list[str], seed: int = 11) -> dict[str, Any]:
    """Per variant and phase: p50 and p99 in ms over ``requests`` requests (each timed once per variant)."""
    import msgspec
    import numpy as np
    import torch

    from adapters.families.cross_encoder import CrossEncoderFamily, PairTokenizer
    from adapters.families.layout import load_fast_tokenizer
    from adapters.runtimes.packed.encoder_forward import PackedPairReplica
    from adapters.runtimes.packed.pending import PendingRequest
    from adapters.runtimes.packed.scheduler import PackedScheduler
    from adapters.runtimes.packed.step import HostStaging
    from benchmarks.gpu_suite.encoder_checkpoint import DOC_TOKENS, DOCS, QUERY_TOKENS
    from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter
    from gateway.http.decoding import decode_json
    from gateway.serving.jobs import dedup, rank_texts, token_job
    from gateway.serving.parts import _OVERLAP_PARTS
    from gateway.serving.service import rank_order
    from schemas.config import LimitsConfig
    from schemas.rerank import (
        ApiVersion,
        BilledUnits,
        RerankMeta,
        RerankRequest,
        RerankResponse,
        RerankResult,
        Tokens,
        Usage,
    )

    spec = WorkloadSpec(requests=requests, documents=DOCS, doc_tokens=DOC_TOKENS, query_tokens=QUERY_TOKENS, seed=seed)
    bodies = [r.body for r in build_workload(spec, load_token_counter(str(model_dir)))]
    tok = load_fast_tokenizer(str(model_dir), None)
    pairs = {v: PairTokenizer(tok, window=8192, max_query_tokens=2048, tokenize_threads=v) for v in variants}
    limits = LimitsConfig()
    # A replica's host half only: ``_pack`` on the CPU staging, no weights.
    replica: Any = object.__new__(type("HostOnly", (PackedPairReplica,), {"_forward": None}))
    replica._arange, replica._offset, replica._staging = torch.arange(0), 2, HostStaging(torch.device("cpu"))
    head: Any = object.__new__(CrossEncoderFamily)
    head.num_labels, head.positive_label, head.activation = 1, 0, "sigmoid"
    sched: Any = object.__new__(PackedScheduler)
    sched._share = False
    loop = asyncio.new_event_loop()
    out_json = msgspec.json.Encoder()
    times: dict[str, dict[str, list[float]]] = {v: {} for v in variants}

    def timed(v: str, phase: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        r = fn()
        times[v].setdefault(phase, []).append((time.perf_counter() - t) * 1e3)
        return r

    def one(v: str, body: bytes) -> None:
        pair = pairs[v]
        req = timed(v, "decode", lambda: decode_json(body, RerankRequest))
        assert isinstance(req.query, str)
        unique, positions = timed(v, "texts", lambda: dedup(rank_texts(req.documents, req.rank_fields)))
        shared = timed(v, "shared", lambda: pair.encode_shared(req.query, ""))
        encs = timed(v, "rust", lambda: pair._encode_batch(unique, add_special_tokens=False))
        timed(v, "ids", lambda: [e.ids for e in encs])
        job, owners = timed(
            v, "job", lambda: loop.run_until_complete(token_job(limits, pair, req.query, "", unique, None, 1))
        )
        ids = pair.encode_documents(unique)
        cached = _Cached(pair, shared, ids)
        timed(v, "loop", lambda: loop.run_until_complete(token_job(limits, cached, req.query, "", unique, None, 1)))
        first = max(1, int(_OVERLAP_PARTS[0] * len(unique)))
        timed(
            v,
            "part1",
            lambda: loop.run_until_complete(token_job(limits, pair, req.query, "", unique[:first], None, 1)),
        )
        pending = PendingRequest(shared, job.item_ids, pair.layout.tail, loop, loop.create_future(), None, False)
        taken = [(pending, i) for i in range(len(job.item_ids))]
        timed(v, "pack", lambda: replica._pack(*PackedScheduler._assemble(sched, taken)[:2]))
        logits = np.random.default_rng(0).standard_normal((len(job.item_ids), 1)).astype(np.float32).tolist()

        def scores() -> list[float]:
            per_item = CrossEncoderFamily.scores(head, job, logits)
            best = [-float("inf")] * len(unique)
            for o, s in zip(owners, per_item, strict=True):
                best[o] = max(best[o], s)
            return [best[p] for p in positions]

        doc_scores = timed(v, "scores", scores)
        results = timed(
            v,
            "rank",
            lambda: [
                RerankResult(index=i, relevance_score=doc_scores[i]) for i in rank_order(doc_scores, len(req.documents))
            ],
        )
        resp = RerankResponse(
            id="x",
            results=results,
            meta=RerankMeta(
                api_version=ApiVersion(version="2"),
                billed_units=BilledUnits(search_units=1),
                tokens=Tokens(input_tokens=len(job.item_ids)),
            ),
            model="m",
            usage=Usage(total_tokens=1),
        )
        timed(v, "encode", lambda: out_json.encode(resp))

    for body in [bodies[0], *bodies]:  # the first once more: warm-up, not counted
        for v in variants:
            one(v, body)
    loop.close()
    return {
        v: {p: {"p50": _percentile(xs[1:], 0.5), "p99": _percentile(xs[1:], 0.99)} for p, xs in phases.items()}
        for v, phases in times.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_suite host", description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/rr-suite/host", help="where the tokenizer is built (once)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--threads", default="1,auto", help="tokenize_threads values, interleaved")
    ap.add_argument("--out", help="write the figures here as JSON")
    ap.add_argument("--tiny", action="store_true", help="a 2k-piece vocabulary: a smoke test of this script")
    args = ap.parse_args()
    from benchmarks.gpu_suite.encoder_checkpoint import REAL_CONFIG, TINY_CONFIG, build

    model_dir = Path(args.work) / ("tiny-tokenizer" if args.tiny else "bge-m3-tokenizer")
    if not (model_dir / "tokenizer.json").exists():
        build(model_dir, dict(TINY_CONFIG if args.tiny else REAL_CONFIG), "cpu", tokenizer_only=True)
    variants = args.threads.split(",")
    figures = profile(model_dir, args.requests, variants)
    print(
        f"host path of one d100 request (ms), {args.requests} requests, cpus {len(os.sched_getaffinity(0))}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    phases = list(next(iter(figures.values())))
    print(f"{'phase':8}" + "".join(f"{v + ' p50':>12}{v + ' p99':>12}" for v in variants))
    for p in phases:
        print(f"{p:8}" + "".join(f"{figures[v][p]['p50']:12.3f}{figures[v][p]['p99']:12.3f}" for v in variants))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
