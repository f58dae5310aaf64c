"""One shape's run: the workload, rounds of every contestant in a rotated order at 1 and 4
clients, docs/s and docs per CPU-second, ratios to the baseline and top-10 agreement.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import psutil

from benchmarks.cpu_encoders.checkpoints import SHAPES
from benchmarks.cpu_encoders.contestants import GATEWAY_VARIANTS, IN_PROCESS, PEERS, TORCH, Gateway, Peer, ScoreFn
from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter

DOCS, DOC_TOKENS, CLIENTS = 50, "60-140", 4


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure(fn: ScoreFn, requests: list[tuple[str, list[str]]], clients: int, pid: int) -> tuple[float, float]:
    """(docs/s over the wall clock, docs per CPU-second of process ``pid``) of one timed run."""

    def run(mine: list[tuple[str, list[str]]]) -> None:
        for q, d in mine:
            fn(q, d)

    cpu = _cpu_s(pid)
    started = time.perf_counter()
    if clients == 1:
        run(requests)
    else:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(run, [requests] * clients))
    wall = time.perf_counter() - started
    cpu = _cpu_s(pid) - cpu
    docs = sum(len(d) for _, d in requests) * (1 if clients == 1 else clients)
    return docs / wall, docs / cpu


def _engine_delta(before: dict[str, Any], after: dict[str, Any], wall: float) -> dict[str, float]:
    """What the engine did between two /ready snapshots: its streams' busy share of the wall
    clock (1.0: every stream always inferring), the padding share, rows per batch."""
    batches = after["batches"] - before["batches"]
    padded = after["padded_tokens"] - before["padded_tokens"]
    return {
        "streams_busy": (after["busy_s"] - before["busy_s"]) / (wall * after["streams"]),
        "padding": 1 - (after["tokens"] - before["tokens"]) / padded if padded else 0.0,
        "rows_per_batch": (after["rows"] - before["rows"]) / batches if batches else 0.0,
    }


def agreement(ref: list[list[float]], got: list[list[float]], tie: float = 1e-3) -> dict[str, float]:
    from adapters.runtimes.parity import compare_rankings

    report = compare_rankings(ref, got, tie=tie)
    return {
        "queries_kept": report.kept,
        "queries": report.queries,
        "mean_shared_top10": report.mean_shared,
        "max_abs_delta": report.max_delta,
    }


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` CPU-bound processes (one spinning thread each) beside the run, stopped after it:
    a busy machine that every round of every contestant shares."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def bench_shape(shape: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model_dir, note = SHAPES[shape](work / shape)
    spec = WorkloadSpec(
        requests=args.requests + args.agree, documents=DOCS, doc_tokens=DOC_TOKENS, query_tokens="10", seed=7
    )
    reqs = [
        (b["query"], b["documents"])
        for b in (msgspec.json.decode(r.body) for r in build_workload(spec, load_token_counter(str(model_dir))))
    ]
    timed, agree_reqs = reqs[: args.requests], reqs[args.requests :]
    wanted = args.contestants.split(";") if args.contestants else [*GATEWAY_VARIANTS, *IN_PROCESS, *PEERS]
    baseline = args.baseline
    fns: dict[str, ScoreFn] = {}
    pids: dict[str, int] = {}  # whose CPU-seconds each contestant is measured by (default: this process)
    skipped: dict[str, str] = {}
    gw_names = [n for n in wanted if n in GATEWAY_VARIANTS]
    gateway = Gateway(model_dir, work / shape, gw_names, args.gate) if gw_names else None
    peers: list[Peer] = []
    peer_info: dict[str, dict[str, Any]] = {}
    try:
        described: dict[str, Any] = {}
        if gateway is not None:
            failed = gateway.wait()
            described = gateway.describe()
            for name in gw_names:
                if name in failed:
                    skipped[name] = failed[name]
                else:
                    fns[name], pids[name] = gateway.scorer(name), gateway.proc.pid
        for name in (n for n in wanted if n in IN_PROCESS):
            try:
                fns[name] = IN_PROCESS[name](model_dir)
            except Exception as exc:  # noqa: BLE001 -- a missing package skips the contestant, said why
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        for name in (n for n in wanted if n in PEERS):
            try:
                peers.append(Peer(args.peers_python or sys.executable, model_dir, *PEERS[name]))
            except RuntimeError as exc:  # the peers' Python lacks the backend's packages: skipped, said why
                skipped[name] = str(exc)
                continue
            fns[name], pids[name] = peers[-1].score, peers[-1].pid
            peer_info[name] = peers[-1].info
        scores = {name: [fn(q, d) for q, d in agree_reqs] for name, fn in fns.items()}  # also the warm-up
        rounds: list[dict[str, Any]] = []
        names = list(fns)
        with busy(args.busy):  # the neighbours run through the timed rounds only
            for r in range(args.rounds):
                k = r % len(names) if names else 0  # every contestant skipped: an empty table, not a crash
                order = names[k:] + names[:k]
                row: dict[str, Any] = {"round": r, "order": order, "load_before": os.getloadavg()[0]}
                for name in order:
                    pid = pids.get(name, os.getpid())
                    # 1 client then 4 (each client half the requests), one after the other: the pair
                    # sees nearly the same neighbours' load; CPU-seconds of the scoring process besides.
                    stats = gateway.engine_stats if gateway is not None and name in GATEWAY_VARIANTS else None
                    s0 = stats(name) if stats else {}
                    t0 = time.perf_counter()
                    one, cpu = measure(fns[name], timed, 1, pid)
                    s1, t1 = (stats(name) if stats else {}), time.perf_counter()
                    four, cpu4 = measure(fns[name], timed[: max(1, args.requests // 2)], CLIENTS, pid)
                    s2, t2 = (stats(name) if stats else {}), time.perf_counter()
                    row[name] = {"1": one, "4": four, "cpu": cpu, "cpu4": cpu4}
                    if "busy_s" in s0:  # the openvino batcher: streams busy, padding, requests per batch
                        row[name]["engine_1"] = _engine_delta(s0, s1, t1 - t0)
                        row[name]["engine_4"] = _engine_delta(s1, s2, t2 - t1)
                    print(
                        f"[{shape}] round {r} {name}: {one:.1f} docs/s 1 client, {four:.1f} at {CLIENTS} ({four / one:.2f}x), "
                        f"{cpu:.1f} / {cpu4:.1f} docs per CPU-second, load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
                row["load_after"] = os.getloadavg()[0]
                rounds.append(row)
    finally:
        if gateway is not None:
            gateway.stop()
        for peer in peers:
            peer.close()
    table = []
    for name in names:
        one = [rd[name]["1"] for rd in rounds]
        four = [rd[name]["4"] for rd in rounds]
        entry: dict[str, Any] = {
            "contestant": name,
            "docs_s_1": statistics.median(one),
            "docs_s_4": statistics.median(four),
            "four_vs_one": statistics.median(f / o for f, o in zip(four, one, strict=True)),
            "docs_per_cpu_s": statistics.median(rd[name]["cpu"] for rd in rounds),
            "docs_per_cpu_s_4": statistics.median(rd[name]["cpu4"] for rd in rounds),
            "four_vs_one_cpu": statistics.median(rd[name]["cpu4"] / rd[name]["cpu"] for rd in rounds),
        }
        if baseline in fns:
            entry["vs_baseline"] = statistics.median(rd[name]["1"] / rd[baseline]["1"] for rd in rounds)
            entry["vs_baseline_4"] = statistics.median(rd[name]["4"] / rd[baseline]["4"] for rd in rounds)
            entry["cpu_vs_baseline"] = statistics.median(rd[name]["cpu"] / rd[baseline]["cpu"] for rd in rounds)
        reference = TORCH if TORCH in fns else baseline
        if reference in fns:  # the top-10 order against torch's fp32 scores where that engine ran
            entry["agreement"] = agreement(scores[reference], scores[name])
        if all("engine_1" in rd[name] for rd in rounds):
            entry["engine"] = {
                f"{k}_{c}": statistics.median(rd[name][f"engine_{c}"][k] for rd in rounds)
                for k in ("streams_busy", "padding", "rows_per_batch")
                for c in ("1", "4")
            }
        if name in peer_info:
            entry["peer"] = peer_info[name]
        if name in described:
            entry["gateway_model"] = {
                k: described[name].get(k)
                for k in ("precision", "inference_precision", "threads", "streams", "parity_kept", "refined_share")
            }
        table.append(entry)
    return {
        "shape": shape,
        "checkpoint": note,
        "baseline": baseline,
        "busy": args.busy,
        "table": table,
        "skipped": skipped,
        "rounds": rounds,
    }
