"""Garbage-collector pauses inside a serving gateway, with and without ``gateway.serving.heap``'s freeze.

    python -m benchmarks.gc_pauses [--rounds 2] [--requests 40] [--engines packed,transformers]

Each gateway is a ``gateway serve`` process started through a small wrapper that records every
collection (``gc.callbacks``: generation, pause, objects collected) and, on SIGUSR1, writes them
with the heap's size (objects tracked, objects frozen) to a JSON file. ``off`` replaces
``heap.settle`` with a no-op in that process: the gateway as it was. Variants alternate (off, on,
off, on, ...) per engine; the load is ``gateway bench``'s d100 workload (1 query x 100
documents of 60-200 tokens) from one client, the tiny XLM-R of ``benchmarks.gpu_encoders --tiny``
on CPU. Only pauses while the bench ran count (loading's own collections are left out).

Writes ``gc_pauses.json`` and ``gc_pauses.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_encoders import COMMON, DOC_TOKENS, DOCS, QUERY_TOKENS, TINY_CONFIG, build
from benchmarks.gpu_qwen3 import _toml

_WRAPPER = r'''
import gc, json, signal, sys, time
out, freeze, config = sys.argv[1], sys.argv[2] == "on", sys.argv[3]
pauses, start = [], [0.0]
def on_gc(phase, info):
    if phase == "start":
        start[0] = time.perf_counter()
    else:
        pauses.append((time.time(), info["generation"], 1e3 * (time.perf_counter() - start[0]), info["collected"]))
gc.callbacks.append(on_gc)
if not freeze:
    import gateway.serving.heap as heap
    heap.settle = lambda reason: None
def dump(*_):
    objects, frozen = len(gc.get_objects()), gc.get_freeze_count()
    t = time.perf_counter()
    gc.collect()  # what any full collection costs this heap, frozen or not
    full = 1e3 * (time.perf_counter() - t)
    with open(out, "w") as f:
        json.dump({"pauses": pauses, "objects": objects, "frozen": frozen, "full_collect_ms": full}, f)
signal.signal(signal.SIGUSR1, dump)
sys.argv = ["gateway", "serve", "--config", config]
from gateway.cli import main
sys.exit(main())
'''

ENGINES: dict[str, dict[str, Any]] = {
    "packed": {**COMMON, "engine": "packed", "devices": ["cpu"], "batch_tokens": 65536},
    "transformers": {**COMMON, "engine": "transformers", "device": "cpu", "dtype": "float32"},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    import urllib.request

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=5) as r:
                if json.loads(r.read()).get("status") == "ready":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError("gateway not ready")


def one_run(engine: str, variant: str, model_dir: Path, work: Path, requests: int) -> dict[str, Any]:
    port = _port()
    url = f"http://127.0.0.1:{port}"
    cfg = work / f"{engine}-{variant}.toml"
    cfg.write_text(_toml({"server": {"host": "127.0.0.1", "port": port}, "logging": {"level": "WARNING"}},
                         [{"name": engine, "path": str(model_dir), **ENGINES[engine]}]))
    dump = work / f"{engine}-{variant}.json"
    dump.unlink(missing_ok=True)
    log = (work / f"{engine}-{variant}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, str(dump), variant, str(cfg)], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "TOKENIZERS_PARALLELISM": "true"})
    try:
        _ready(url, proc)
        out = work / f"bench-{engine}-{variant}"
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "gateway", "bench", url, "--model", engine, "--tokenizer", str(model_dir),
                        "--documents", str(DOCS), "--doc-tokens", DOC_TOKENS, "--query-tokens", QUERY_TOKENS,
                        "--concurrency", "1", "--requests", str(requests), "--warmup", "4", "--seed", "5",
                        "--no-progress", "--no-plot", "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
        t1 = time.time()
        proc.send_signal(signal.SIGUSR1)
        for _ in range(100):
            if dump.exists() and dump.stat().st_size:
                break
            time.sleep(0.1)
        time.sleep(0.2)
        heap = json.loads(dump.read_text())
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    (s,) = json.loads((out / "bench.json").read_text())["summaries"]
    during = [p for p in heap["pauses"] if t0 <= p[0] <= t1]
    gen2 = sorted(p[2] for p in during if p[1] == 2)
    every = sorted(p[2] for p in during)
    return {"engine": engine, "variant": variant, "objects": heap["objects"], "frozen": heap["frozen"],
            "full_collect_ms": heap["full_collect_ms"],
            "collections": len(during), "gen2_collections": len(gen2), "pause_ms_total": sum(every),
            "pause_ms_max": every[-1] if every else 0.0, "gen2_pause_ms_max": gen2[-1] if gen2 else 0.0,
            "gen2_pause_ms": gen2, "latency_ms": s["latency_ms"], "server_timing_pct_ms": s.get("server_timing_pct_ms")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="packed,transformers")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--out", default="bench-out/gc_pauses")
    ap.add_argument("--work", default="/tmp/rr-gc-pauses")
    args = ap.parse_args()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "xlmr-tiny"
    if not (model_dir / "config.json").exists():
        build(model_dir, TINY_CONFIG, "cpu")
    runs = []
    for r in range(args.rounds):
        for engine in args.engines.split(","):
            for variant in (("off", "on") if r % 2 == 0 else ("on", "off")):
                row = one_run(engine, variant, model_dir, work, args.requests)
                row["round"] = r
                runs.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("gen2_pause_ms", "server_timing_pct_ms")}),
                      flush=True)
    doc = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average": os.getloadavg(),
           "cpus": os.cpu_count(), "python": sys.version.split()[0], "runs": runs}
    (out / "gc_pauses.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# GC pauses in a serving gateway, freeze off / on ({doc['date_utc']})", "",
             f"Python {doc['python']}, {doc['cpus']} CPUs, load average {', '.join(f'{x:.2f}' for x in doc['load_average'])}; "
             f"d100 from one client, {args.requests} requests per run; tiny XLM-R on CPU.", "",
             "| engine | freeze | round | heap objects | frozen | full collection ms | collections | gen-2 | gen-2 max ms | all pauses ms | p50 / p99 / max ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in runs:
        lat = x["latency_ms"]
        lines.append(f"| {x['engine']} | {x['variant']} | {x['round']} | {x['objects']:,} | {x['frozen']:,} | {x['full_collect_ms']:.1f} | {x['collections']} | "
                     f"{x['gen2_collections']} | {x['gen2_pause_ms_max']:.1f} | {x['pause_ms_total']:.1f} | "
                     f"{lat['p50']:.1f} / {lat['p99']:.1f} / {lat['max']:.1f} |")
    (out / "gc_pauses.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
