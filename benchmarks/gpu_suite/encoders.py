"""Issue 20's GPU run: bge-reranker-v2-m3's shape on every cross-encoder runtime, over HTTP, one H200.

    RR_SKIP_CHECK=1 RR_BUDGET=520 RR_CMD="python3 -m benchmarks.gpu_suite encoders" bash .gpu/device_run.sh

Each runtime (``--runtimes``; labels and A/B variants in ``encoders_runtimes.py``) is its own
``python -m gateway serve`` process, one after the other, and ``rerank-gateway bench`` the load
client (this process never touches CUDA). Checkpoint: XLM-R large's real config with random bf16
weights and a 250,002-piece Unigram tokenizer built offline (``encoder_checkpoint.py``).
Workload d100: 1 query (15 tokens) x 100 documents of U[60,200] tokens.

Rows per runtime: d100 at 1 client (p50 / p99 / max) and at ``--clients`` (docs/s), each row's
server timing per phase; the compute floor (FLOPs per request over the measured bf16 matmul
rate) and MFU. One probe request is scored against plain transformers in fp32, and again beside
a loaded level's warm pass (or measured run): graph memory clobbered under load would give other
finite scores, which the engine cannot see. A runtime that would pass the deadline
(``RR_DEADLINE``, else ``--budget`` s) is skipped and listed. Writes ``encoders_results.json``
and ``encoders_summary.md`` (``encoders_report.py``). ``--tiny``: the same on CPU with a tiny
XLM-R (a logic check, not a measurement).

Removed on 2026-12-05, answered in their reports: ``--model modernbert-base`` (gpu-h200-2026-12-02),
the forward probe and other one-off A/B runtimes (gpu-h200-2026-12-02 to -12-03).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.gpu_suite.encoder_checkpoint import (
    DOC_TOKENS,
    DOCS,
    QUERY_TOKENS,
    REAL_CONFIG,
    TINY_CONFIG,
    build,
    flops_per_request,
    pair_lengths,
    probe_request,
    reference_scores,
)
from benchmarks.gpu_suite.encoders_report import TITLE, summary
from benchmarks.gpu_suite.encoders_runtimes import NEEDS, RUNTIME_ENV, RUNTIMES
from benchmarks.harness import Gateway, bench_level, gpu_mem_mib, serve
from schemas.config import Settings


def log(*a: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] [encoders]", *a, flush=True)


def agreement(got: list[float], want: list[float]) -> dict[str, Any]:
    """max |score difference| and how many of the reference's top 10 are in the runtime's top 10 (and in order)."""
    top = lambda xs: sorted(range(len(xs)), key=lambda i: -xs[i])[:10]
    return {
        "max_abs_diff": max(abs(a - b) for a, b in zip(got, want, strict=True)),
        "top10_shared": len(set(top(got)) & set(top(want))),
        "top10_same_order": top(got) == top(want),
        "spread": max(want) - min(want),
    }


# gateway bench's --warmup per level (--warmup), and requests of a separate unmeasured pass of the
# same traffic (other documents) before each level (--warm-pass; 0: none)
WARMUP = {"requests": 4, "pass": 0}


# At most this many probe requests during a loaded level (``watch``)
WATCH_MAX = 60


def watch(gw: Gateway, model: str, probe: dict[str, Any], idle: list[float], stop: threading.Event) -> dict[str, Any]:
    """The probe request again and again while a loaded level runs, each answer against the idle
    one: a step whose memory another write clobbered answers other scores (non-finite logits are
    caught and scored again by the engine; wrong finite ones would not be). Packed beside other
    requests' pairs, an answer differs from the idle one by bf16 rounding of other GEMM shapes."""
    diffs: list[float] = []
    orders = errors = 0
    top = idle.index(max(idle))
    while not stop.is_set() and len(diffs) + errors < WATCH_MAX:
        try:
            got = gw.rerank(model, probe["query"], probe["documents"])
        except Exception:  # counted: an error here is a finding, not a crash of the bench  # noqa: BLE001
            errors += 1
            continue
        diffs.append(max(abs(a - b) for a, b in zip(got, idle, strict=True)))
        orders += int(got.index(max(got)) != top)
    return {
        "answers": len(diffs),
        "errors": errors,
        "max_abs_diff": max(diffs, default=None),
        "over_1e-2": sum(d > 1e-2 for d in diffs),
        "top1_changed": orders,
    }


def bench(
    gw: Gateway,
    model: str,
    model_dir: Path,
    clients: int,
    requests: int,
    out: Path,
    gpu: bool,
    probe: tuple[dict[str, Any], list[float]] | None = None,
) -> dict[str, Any]:
    def run(n: int, seed: int, warmup: int, folder: Path) -> dict[str, Any]:
        opts = {"documents": DOCS, "doc_tokens": DOC_TOKENS, "query_tokens": QUERY_TOKENS, "concurrency": clients}
        title = f"{model} d100 {clients} clients"
        return bench_level(gw.url, model, model_dir, folder, **opts, requests=n, warmup=warmup, seed=seed, title=title)

    watched: dict[str, Any] = {}

    def watching(*a: Any) -> dict[str, Any]:
        """``run(*a)`` with the probe request sent again and again beside it (``watch``)."""
        stop = threading.Event()
        watcher = threading.Thread(
            target=lambda: watched.update(watch(gw, model, probe[0], probe[1], stop)), daemon=True
        )
        watcher.start()
        try:
            return run(*a)
        finally:
            stop.set()
            watcher.join(timeout=150)

    # The probe watches a loaded level's warm pass (where most graphs are captured) or, without
    # one, its measured run (whose docs/s then carries the probe's requests too).
    watch_pass = probe is not None and clients > 1
    if WARMUP["pass"]:  # traffic of the same kind (other documents: another seed) before the measured run, not counted
        (watching if watch_pass else run)(WARMUP["pass"], 1011 + clients, 0, out.with_name(out.name + "-warm"))
    before = _graph_stats(gw)
    s = (watching if watch_pass and not WARMUP["pass"] else run)(requests, 11 + clients, WARMUP["requests"], out)
    after = _graph_stats(gw)
    # CUDA graphs captured during the measured run (its own warm-up requests included): each cost a
    # step ~10-90 ms; and idle steps replayed in a larger captured bucket instead (graphs.COVER)
    captures = after["captures"] - before["captures"] if before and after else None
    covered = after.get("covered_steps", 0) - before.get("covered_steps", 0) if before and after else None
    lat = s["latency_ms"]
    row = {
        "clients": clients,
        "requests": requests,
        "docs_per_s": s["docs_per_s"],
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "max_ms": lat["max"],
        "errors": s["errors"],
        "first_error": s.get("first_error"),
        "server_timing_ms": s.get("server_timing_ms"),
        "server_timing_pct_ms": s.get("server_timing_pct_ms"),
        "gpu_mib": gpu_mem_mib() - gw.base_mib if gpu else None,
        "graph_captures": captures,
        "covered_steps": covered,
        "warm_pass_requests": WARMUP["pass"],
        "probe_under_load": {**watched, "during": "warm pass" if WARMUP["pass"] else "measured run"}
        if watched
        else None,
    }
    log(
        f"{model} d100 x{clients}: {row['docs_per_s']:.0f} docs/s, p50 {row['p50_ms']:.1f}, p99 {row['p99_ms']:.1f}, "
        f"max {row['max_ms']:.1f} ms, errors {row['errors']}"
        + (f"; probe under load {json.dumps(watched)}" if watched else "")
    )
    return row


def _graph_stats(gw: Gateway) -> dict[str, Any] | None:
    """The packed engine's CUDA graph counters so far (None: no graphs)."""
    stats = (gw.status() or {}).get("models", [{}])[0].get("engine_stats") or {}
    graphs = stats.get("cuda_graphs")
    return graphs if isinstance(graphs, dict) else None


def run_runtime(
    label: str, model_cfg: dict[str, Any], model_dir: Path, work: Path, levels: dict[int, int], deadline: float,
    results: dict[str, Any], gpu: bool,
) -> None:  # fmt: skip
    cfg = {"name": label, "path": str(model_dir), **model_cfg}

    def measure(gw: Gateway, entry: dict[str, Any], body: dict[str, Any]) -> None:
        (status,) = body["models"]
        entry["engine_stats"] = status.get("engine_stats")
        entry["describe"] = {k: status.get(k) for k in ("runtime", "device", "dtype", "family")}
        log(f"{label}: {json.dumps(entry['describe'])}; attention {(entry['engine_stats'] or {}).get('attention')}")
        probe = results.get("probe")
        if probe:  # the same request twice: scores against the fp32 reference, and repeatability
            first = gw.rerank(label, probe["query"], probe["documents"])
            again = gw.rerank(label, probe["query"], probe["documents"])
            entry["probe"] = {
                **agreement(first, probe["reference"]),
                "repeat_max_abs_diff": max(abs(a - b) for a, b in zip(first, again, strict=True)),
            }
            log(f"{label}: probe vs fp32 reference {json.dumps(entry['probe'])}")
        for clients, n in levels.items():
            if deadline - time.time() < 15:
                results["skipped"].append(f"{label} x{clients}: deadline")
                continue
            folder, watched = work / f"{label}-{clients}", (probe, first) if probe else None
            entry["rows"].append(bench(gw, label, model_dir, clients, n, folder, gpu, watched))
        entry["engine_stats_after"] = (gw.status() or {}).get("models", [{}])[0].get("engine_stats")

    results["runs"][label] = {"model": cfg, "rows": []}
    need = NEEDS.get(label, 90)
    serve(label, [cfg], work, results, measure, need_s=need, deadline=deadline, log=log, env=RUNTIME_ENV.get(label))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtimes", default="packed,vllm-score,transformers", help="comma list, run in this order")
    ap.add_argument("--tiny", action="store_true", help="CPU check of this script: tiny model, cpu devices")
    ap.add_argument("--idle-requests", type=int, default=40)
    ap.add_argument("--load-requests", type=int, default=160, help="requests at 16 clients")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=4, help="unmeasured requests before each level's measured ones")
    ap.add_argument("--warm-pass", type=int, default=0, help="unmeasured requests of other documents before each level")
    ap.add_argument("--budget", type=float, default=480, help="seconds from now, when RR_DEADLINE is not set")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out/encoders"))
    ap.add_argument("--work", default="/tmp/rr-encoders")
    args = ap.parse_args()
    WARMUP["requests"], WARMUP["pass"] = args.warmup, args.warm_pass
    deadline = float(os.environ.get("RR_DEADLINE") or 0) or time.time() + args.budget
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    gpu = not args.tiny
    cfg = dict(TINY_CONFIG if args.tiny else REAL_CONFIG)
    results: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": {},
        "skipped": [],
        "config": cfg,
        "title": TITLE,
        "workload": {"documents": DOCS, "doc_tokens": DOC_TOKENS, "query_tokens": QUERY_TOKENS},
    }

    def save() -> None:
        (out / "encoders_results.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "encoders_summary.md").write_text(summary(results))

    labels = args.runtimes.split(",")
    for label in labels:  # every runtime's config, typed as the gateway will read it: a typo fails now, not in minutes
        msgspec.convert({"models": [{"name": label, "path": "/nonexistent", **RUNTIMES[label]}]}, Settings, strict=True)
    t = time.time()
    model_dir = work / ("xlmr-tiny" if args.tiny else "xlmr-large")
    rates = build(model_dir, cfg, "cpu" if args.tiny else "cuda")
    results["device"] = rates.get("device", "cpu (--tiny: a logic check, not a measurement)")
    # uvicorn's loop = "auto": uvloop when it is installed (a dependency of the project; the GPU bundle added it 2026-12-02)
    results["event_loop"] = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    lens = pair_lengths(model_dir, cfg)
    tokens = sum(sum(x) for x in lens) / len(lens)
    flop = sum(flops_per_request(cfg, x) for x in lens) / len(lens)
    floor: dict[str, Any] = {"tokens_per_request": tokens, "tflop_per_request": flop / 1e12}
    if rates.get("square_8192_tflops"):
        floor.update(
            square_tflops=rates["square_8192_tflops"],
            gemm_tflops=rates["model_gemms_tflops"],
            gemm_each_tflops=rates["model_gemms_each"],
            ms_at_100pct_square=1e3 * flop / (rates["square_8192_tflops"] * 1e12),
            ms_at_100pct_gemms=1e3 * flop / (rates["model_gemms_tflops"] * 1e12),
            docs_per_s_at_100pct=DOCS * rates["square_8192_tflops"] * 1e12 / flop,
        )
    results["floor"] = floor
    log(f"checkpoint + rates in {time.time() - t:.0f}s: {json.dumps(floor)}")
    query, docs = probe_request(model_dir)  # the probe request and its fp32 reference
    results["probe"] = {
        "query": query,
        "documents": docs,
        "reference": reference_scores(model_dir, "cpu" if args.tiny else "cuda", query, docs),
    }
    save()
    levels = {1: args.idle_requests, args.clients: args.load_requests}
    for label in labels:
        model_cfg = dict(RUNTIMES[label])
        if args.tiny:  # same engines on CPU: packed on "cpu", transformers on "cpu" in float32
            model_cfg.update({"devices": ["cpu"]} if label.startswith("packed") else {})
            model_cfg.update({"device": "cpu", "dtype": "float32"} if label == "transformers" else {})
        run_runtime(label, model_cfg, model_dir, work, levels, deadline, results, gpu)
        e = results["runs"].get(label, {})
        rows = {r["clients"]: r for r in e.get("rows", [])}
        rate = rates.get("square_8192_tflops")
        if rate and rows:  # MFU against the square bf16 rate: achieved FLOP/s over the measured peak
            if args.clients in rows:
                e["mfu_many"] = rows[args.clients]["docs_per_s"] / DOCS * flop / (rate * 1e12)
            if 1 in rows:
                e["mfu_one"] = flop / (rows[1]["p50_ms"] / 1e3) / (rate * 1e12)
        save()
    save()
    log("done")
