"""Issue 24's GPU run: every Qwen3 runtime behind the real CLI, over HTTP, one H200.

    RR_SKIP_CHECK=1 RR_BUDGET=540 RR_CMD="python3 -m benchmarks.gpu_suite qwen3 --phases 0.6b" bash .gpu/device_run.sh

Each gateway is its own ``python -m gateway serve`` process (this one never touches CUDA, so
vLLM forks or spawns as in production), ``rerank-gateway bench`` the client. Checkpoints: the
real configs of Qwen3-Reranker-0.6B / -4B / -8B, random bf16 weights, the offline BPE tokenizer
of ``tests.tiny_qwen3``. Phases:

- ``0.6b``: one gateway serving packed bf16 (shared prefixes), packed bf16 with whole prompts and
  packed fp8, level by level (d100 at 1 client, d100 and d300 at 16) after one request each
  compared with packed bf16; the issue's targets judged on those levels (``targets.py``: met
  only with zero failed requests, >= 200 requests for a p99, clear of the spread).
- ``4b``, ``8b``: each runtime in its own gateway: GPU memory ready and at peak, d100 at 1 and 16.

A step that would pass the deadline (``RR_DEADLINE``) is skipped and listed. Writes
``qwen3_results.json`` and ``qwen3_summary.md``. ``--smoke``: the 0.6b phase's packed gateway on
CPU, tiny Qwen3, a few 10-document requests per level (a logic check). ``--vllm`` (vLLM beside
packed, spawned) was removed on 2026-12-05, answered in gpu-h200-2026-12-01-c.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_suite.targets import P99_MIN_SAMPLES, targets_table
from benchmarks.harness import ROOT, Gateway, bench_level, gpu_mem_mib, serve, smi, table

# name -> (documents per request, doc tokens)
WORKLOADS: dict[str, tuple[int, str]] = {"d100": (100, "50-150"), "d300": (100, "150-450")}
SMALL_WORKLOADS: dict[str, tuple[int, str]] = {"d100": (10, "20-40"), "d300": (10, "40-80")}
Request = tuple[str, list[str]]

REAL_CONFIG = {
    "vocab_size": 151669,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
}
# Qwen3-Reranker-0.6B / -4B / -8B config.json (the Qwen3 bases): the shapes of the phases.
SIZES: dict[str, dict[str, Any]] = {
    "0.6b": REAL_CONFIG,
    "4b": {**REAL_CONFIG, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36}
    | {"num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "8b": {**REAL_CONFIG, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36}
    | {"num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
}
COMMON = {"max_length": 2048, "max_query_tokens": 256}
PACKED = {**COMMON, "engine": "packed", "batch_tokens": 65536}
VLLM = {**COMMON, "max_num_batched_tokens": 65536, "max_num_seqs": 512}
RUNTIMES: dict[str, dict[str, Any]] = {
    "packed bf16": PACKED,
    "packed bf16 whole": {**PACKED, "share_prefix": False},  # each prompt computed whole, as before
    # Random weights carry no ranking: the gate is reported, not enforced, so speed can be measured.
    "packed fp8": {**PACKED, "precision": "fp8", "precision_gate": "warn"},
    "vllm-score": {**VLLM, "engine": "vllm-score"},
    "vllm-generate": {**VLLM, "engine": "vllm-generate"},
    "transformers": {**COMMON, "engine": "transformers", "device": "cuda", "dtype": "bfloat16"},
    # two GPUs (a multi-GPU kind; the default run's twogpu phase until 2026-12-05): replicas, a pipeline
    "packed 2gpu": {**PACKED, "devices": ["cuda:0", "cuda:1"]},
    "packed split": {**PACKED, "devices": ["cuda:0", "cuda:1"], "split": "pipeline"},
}
# (workload, clients) -> requests, per model size
LEVELS = {
    "0.6b": {("d100", 1): P99_MIN_SAMPLES, ("d100", 16): 160, ("d300", 16): 96},  # idle: enough for a p99 verdict
    "tiny": {("d100", 1): 2, ("d100", 4): 4, ("d300", 4): 4},  # --smoke: the logic, not a measurement
    "4b": {("d100", 1): 30, ("d100", 16): 64},
    "8b": {("d100", 1): 24, ("d100", 16): 48},
}
DEADLINE = float(os.environ.get("RR_DEADLINE") or 0) or time.time() + 3600
SMOKE = False  # --smoke: 10-document requests (SMALL_WORKLOADS)


def log(*a: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] [qwen3]", *a, flush=True)


def build_checkpoint(out: Path, small: bool, config: dict[str, Any] = REAL_CONFIG) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.tiny_qwen3 import build_tiny_qwen3

    # A larger BPE vocabulary learns the template's words, so the shared prefix is ~Qwen's length.
    build_tiny_qwen3(out, vocab_size=512 if small else 2048)
    if small:
        return out
    cfg_small = json.loads((out / "config.json").read_text())
    cfg = Qwen3Config(**config, eos_token_id=cfg_small.get("eos_token_id"), pad_token_id=cfg_small.get("pad_token_id"))
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16: an 8B model in fp32 would take 32 GB first
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg)
    torch.set_default_dtype(dtype)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


def build(size: str, out: Path) -> Path:
    """The checkpoint (``build_checkpoint``), written by a child process: this one never initialises CUDA."""
    small, config = size == "tiny", SIZES.get(size, REAL_CONFIG)
    code = f"from pathlib import Path; from benchmarks.gpu_suite.qwen3 import build_checkpoint as b; b(Path({str(out)!r}), {small}, {config!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return out


def bench(gw: Gateway, model: str, model_dir: Path, wl: str, clients: int, requests: int, out: Path) -> dict[str, Any]:
    docs, doc_tokens = (SMALL_WORKLOADS if SMOKE else WORKLOADS)[wl]
    peak = [gpu_mem_mib()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            peak[0] = max(peak[0], gpu_mem_mib())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    seed = {"d100": 11, "d300": 13}[wl] + clients
    try:
        title = f"{model} {wl} {clients} clients"
        opts = {"documents": docs, "doc_tokens": doc_tokens, "concurrency": clients, "requests": requests}
        s = bench_level(gw.url, model, model_dir, out, **opts, seed=seed, title=title)
    finally:
        stop.set()
        t.join()
    row = {
        "workload": wl,
        "clients": clients,
        "requests": requests,
        "docs_per_s": s["docs_per_s"],
        "p50_ms": s["latency_ms"]["p50"],
        "p99_ms": s["latency_ms"]["p99"],
        "errors": s["errors"],
        "server_timing_ms": s.get("server_timing_ms"),
        "gpu_peak_mib": peak[0] - gw.base_mib,
        "summary": s,  # every request counted: what the targets judge
    }
    log(
        f"{gw.name} / {model} {wl} x{clients}: {row['docs_per_s']:.0f} docs/s, p50 {row['p50_ms']:.1f}, p99 {row['p99_ms']:.1f} ms, "
        f"errors {row['errors']}, peak {row['gpu_peak_mib']} MiB"
    )
    return row


def agreement(gw: Gateway, labels: list[str]) -> dict[str, Any]:
    """One 100-document request to each model: max |score - first model's score| per model (on random
    weights scores sit near 0.5: the spread is given beside it to size the differences)."""
    import random

    rng = random.Random(5)
    words = [
        "capital",
        "city",
        "state",
        "river",
        "market",
        "school",
        "engine",
        "paper",
        "garden",
        "music",
        "ocean",
        "winter",
    ]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 120))) for _ in range(100)]
    query = "which city is the capital"
    scores = {label: gw.rerank(label.replace(" ", "-"), query, docs, timeout=60) for label in labels}
    ref = scores[labels[0]]
    mean = sum(ref) / len(ref)
    out: dict[str, Any] = {
        "reference": labels[0],
        "reference_std": (sum((x - mean) ** 2 for x in ref) / len(ref)) ** 0.5,
    }
    for label in labels[1:]:
        out[label] = max(abs(a - b) for a, b in zip(scores[label], ref, strict=True))
    return out


def serve_and_bench(
    name: str, models: dict[str, dict[str, Any]], measure: list[str], size: str, model_dir: Path, work: Path,
    results: dict[str, Any], need_s: float = 120,
) -> None:  # fmt: skip
    """One gateway serving ``models`` (label -> config); each label of ``measure`` through every level."""
    cfgs = [{"name": label.replace(" ", "-"), "path": str(model_dir), **cfg} for label, cfg in models.items()]
    for c in cfgs if size != "0.6b" else []:
        if c["engine"].startswith("vllm"):
            c["gpu_memory_utilization"] = 0.45  # 16 GB of 8B weights + 64k-token steps' KV

    def run(gw: Gateway, entry: dict[str, Any], body: dict[str, Any]) -> None:
        entry["engine_stats"] = {m["name"]: m.get("engine_stats") for m in body["models"]}
        log(
            f"{name}: precision {json.dumps({k: (v or {}).get('precision') for k, v in entry['engine_stats'].items()})}"
        )
        if sum(label.startswith("packed") for label in measure) > 1:
            entry["agreement"] = agreement(gw, [label for label in measure if label.startswith("packed")])
            log(f"{name}: scores against {measure[0]}: {json.dumps(entry['agreement'])}")
        entry["rows"] = {label: [] for label in measure}
        # Side by side: every model through one level before the next (the card's clocks and power
        # cap drift over minutes; this keeps the models' figures of one level minutes apart at most).
        for (wl, c), n in LEVELS[size].items():
            for label in measure:
                if DEADLINE - time.time() < 25:
                    results["skipped"].append(f"{name} / {label} {wl} x{c}: deadline")
                    continue
                folder = work / f"{name}-{label}-{wl}-{c}".replace(" ", "_")
                entry["rows"][label].append(bench(gw, label.replace(" ", "-"), model_dir, wl, c, n, folder))
        # steps, step time, prompt vs computed tokens over the whole run, per model
        keys = ("steps", "step_ms_mean", "prompt_tokens", "computed_tokens", "share_prefix", "prefix_sharing")
        entry["engine_stats_after"] = {
            m["name"]: {k: (m.get("engine_stats") or {}).get(k) for k in (*keys, "steps_by_requests")}
            for m in (gw.status() or {}).get("models", [])
        }

    results["runs"][name] = {"models": cfgs, "size": size}
    serve(name, cfgs, work, results, run, need_s=need_s, deadline=DEADLINE, log=log)


def summary(results: dict[str, Any]) -> str:
    rows: list[list[Any]] = []
    for name, e in results["runs"].items():
        run = [name, e.get("size", ""), "", f"{e.get('start_s', 0):.0f}", e.get("gpu_ready_mib") or "-"]
        for label, levels in (e.get("rows") or {}).items():
            for r in levels:
                rows.append([*run[:2], label, *run[3:], r["workload"], r["clients"], f"{r['docs_per_s']:,.0f}"])
                rows[-1] += [f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", r["gpu_peak_mib"], r["errors"]]
        if e.get("error"):
            rows.append([name, "", f"error: {e['error'][:300]}"])
        if e.get("agreement"):
            diffs = json.dumps({k: v for k, v in e["agreement"].items() if k != "reference"})
            rows.append(
                [name, "", f"max score difference to {e['agreement']['reference']} (one 100-document request): {diffs}"]
            )
    head = ["run", "model", "runtime", "start s", "GPU MiB ready", "workload", "clients", "docs/s", "p50 ms", "p99 ms"]
    lines = [f"# Qwen3 runtimes on {results.get('device', '?')} ({results['date_utc']})", ""]
    lines += table([*head, "peak MiB", "errors"], rows)
    for name, e in results["runs"].items():
        by_label = e.get("rows") or {}
        if len(by_label) < 2:
            continue
        labels = list(by_label)
        cells: dict[tuple[str, int], list[Any]] = {(r["workload"], r["clients"]): [] for r in by_label[labels[0]]}
        for label in labels:
            got = {(r["workload"], r["clients"]): r for r in by_label[label]}
            for (wl, c), row in cells.items():
                r = got.get((wl, c))
                row.append(
                    "–"
                    if r is None
                    else f"p50 {r['p50_ms']:.1f} / p99 {r['p99_ms']:.1f} ms"
                    if c == 1
                    else f"{r['docs_per_s']:,.0f} docs/s"
                )
        lines += [
            "",
            f"## {name}: side by side",
            "",
            *table(["workload", "clients", *labels], [[*k, *v] for k, v in cells.items()]),
            "",
        ]
        for model, st in (e.get("engine_stats_after") or {}).items():
            if st.get("prompt_tokens"):
                lines.append(
                    f"- {model}: {st['steps']} steps of {st['step_ms_mean']:.1f} ms mean; computed "
                    f"{st['computed_tokens']:,} of {st['prompt_tokens']:,} prompt tokens "
                    f"({st['computed_tokens'] / st['prompt_tokens']:.0%}); prefix sharing {st.get('prefix_sharing')}"
                )
    judged = {
        label: {(r["workload"], r["clients"]): r["summary"] for r in levels if "summary" in r}
        for e in results["runs"].values()
        if e.get("size") in ("0.6b", "tiny")
        for label, levels in (e.get("rows") or {}).items()
    }
    if judged := {label: levels for label, levels in judged.items() if levels}:  # results before 2026-12-05: none
        lines += ["", "## Targets (Qwen3-0.6B shape, over HTTP through the gateway)", "", *targets_table(judged)]
    lines += ["", "skipped: " + json.dumps(results["skipped"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default="0.6b", help="comma list of 0.6b, 4b, 8b")
    ap.add_argument("--runtimes", default=",".join(list(RUNTIMES)[:6]), help="for 4b/8b: which runtimes, in order")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out/qwen3"))
    ap.add_argument("--work", default="/tmp/rr-qwen3")
    ap.add_argument(
        "--smoke", action="store_true", help="CPU, tiny Qwen3, a few requests: check the script, measure nothing"
    )
    args = ap.parse_args()
    global SMOKE
    SMOKE = args.smoke
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": {},
        "skipped": [],
    }
    results["device"] = (
        smi("--query-gpu=name,memory.total,power.limit,driver_version", "--format=csv,noheader") or "CPU (--smoke)"
    )

    def save() -> None:
        (out / "qwen3_results.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "qwen3_summary.md").write_text(summary(results))

    for phase in ["tiny"] if args.smoke else args.phases.split(","):
        size = phase.removesuffix("-packed")  # "0.6b-packed": the same as "0.6b" (it was 0.6b without --vllm)
        t = time.time()
        model_dir = build(size, work / f"qwen3-{size}")
        log(f"checkpoint {size} in {time.time() - t:.0f}s")
        if size in ("0.6b", "tiny"):
            packed = {label: RUNTIMES[label] for label in ("packed bf16", "packed bf16 whole", "packed fp8")}
            steps = [(f"{size} packed", packed, list(packed), 150)]
        else:
            steps = [
                (f"{size} {r}", {r: RUNTIMES[r]}, [r], 60 if r.startswith("packed") else 110)
                for r in args.runtimes.split(",")
            ]
        for name, models, measure, need in steps:
            serve_and_bench(name, models, measure, size, model_dir, work, results, need)
            save()
        if size not in ("0.6b", "tiny"):
            import shutil

            shutil.rmtree(model_dir, ignore_errors=True)  # 8-16 GB of disk
    save()
    log("done")
