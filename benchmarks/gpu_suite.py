"""The GPU run: every variant in one process within a deadline (one device call, ~9 minutes).

    RR_BUDGET=520 RR_CMD="python3 -m benchmarks.gpu_suite" bash .gpu/device_run.sh

Phases, in order of importance (a phase that would pass the deadline is skipped and says so):

1. checkpoint: Qwen3-Reranker-0.6B's real config (28 layers, hidden 1024, 16/8 heads, head_dim
   128, MLP 3072, vocab 151,669, tied embeddings) with random bf16 weights -- weights do not
   change speed -- and the offline BPE tokenizer of ``tests.tiny_qwen3`` (lengths are cut in its
   tokens, so prompt lengths match the workload); bf16 matmul rate.
2. gateway over HTTP: ``create_app`` with a ``vllm-score`` model served by uvicorn in this
   process, ``rerank-gateway bench`` as a separate client process: d100 and d300, 1 and 16
   clients. Then the same service in-process (no HTTP), on fresh requests.
3. raw offline ``LLM.score`` and the seed's design (one LLM start for both).
4. our transformers engine; 5. our vllm-generate engine.

Writes to $OUT: gpu_results.json, gpu_report.md, and the bench plots (log.txt comes from
device_run.sh). ``--small`` runs the same code on the tiny model on CPU (smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # device_run.sh turns it off; the gateway wants it

import msgspec

from benchmarks import engine_bench as eb

REAL_CONFIG = dict(vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                   rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
                   attention_bias=False)
# Scheduler steps sized for the workload: a d100 request is ~17k tokens in ~100 sequences, 16
# clients send ~270k tokens at once; 64k-token steps of up to 512 sequences take them in a few.
_VLLM_GPU = {"max_length": 2048, "max_query_tokens": 256, "gpu_memory_utilization": 0.3, "max_num_batched_tokens": 65536, "max_num_seqs": 512}
GPU_ENGINES: dict[str, dict[str, Any]] = {
    "vllm-score": _VLLM_GPU, "vllm-generate": _VLLM_GPU,
    "transformers": {"max_length": 2048, "max_query_tokens": 256, "device": "cuda", "dtype": "bfloat16"},
}
_VLLM_CPU = {"max_length": 1024, "max_query_tokens": 256, "gpu_memory_utilization": 0.05, "enforce_eager": True}
SMALL_ENGINES: dict[str, dict[str, Any]] = {"vllm-score": _VLLM_CPU, "vllm-generate": _VLLM_CPU,
                                            "transformers": {"max_length": 1024, "max_query_tokens": 256}}
DEADLINE = float(os.environ.get("RR_DEADLINE") or 0) or time.time() + 3600


def log(*a: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] [suite]", *a, flush=True)


def left() -> float:
    return DEADLINE - time.time()


def build_checkpoint(out: Path, small: bool) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.tiny_qwen3 import build_tiny_qwen3

    # A larger BPE vocabulary learns the template's words, so the shared prefix is ~Qwen's length.
    build_tiny_qwen3(out, vocab_size=512 if small else 2048)
    if small:
        return out
    cfg_small = json.loads((out / "config.json").read_text())
    cfg = Qwen3Config(**REAL_CONFIG, eos_token_id=cfg_small.get("eos_token_id"), pad_token_id=cfg_small.get("pad_token_id"))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


async def _bench_http(url: str, model: str, model_dir: Path, wl: str, out: Path, small: bool, requests: int) -> dict[str, Any]:
    docs, doc_tokens, _, _ = (eb.SMALL_WORKLOADS if small else eb.WORKLOADS)[wl]
    args = [sys.executable, "-m", "gateway", "bench", url, "--model", model, "--tokenizer", str(model_dir),
            "--documents", str(docs), "--doc-tokens", doc_tokens, "--query-tokens", "10", "--concurrency", "1,16",
            "--requests", str(requests), "--warmup", "4", "--seed", str({"d100": 11, "d300": 13}[wl]),
            "--title", f"Gateway over HTTP, {wl}", "--no-progress", "--out", str(out)]
    proc = await asyncio.create_subprocess_exec(*args)  # a separate process: the client's CPU is not ours
    if await proc.wait() != 0:
        raise RuntimeError(f"bench {wl} failed")
    return json.loads((out / "bench.json").read_text())


async def phase_gateway(model_dir: Path, kinds: list[str], engine_cfg: dict[str, Any], work: Path, small: bool,
                        lengths: Any, cfg: dict[str, Any], tflops: float) -> dict[str, Any]:
    """One gateway serving one model per engine kind (named after the kind), over HTTP then in-process."""
    import socket

    import uvicorn

    from gateway.app import create_app
    from schemas.config import Settings
    from schemas.rerank import RerankRequest

    models = [{"name": kind, "engine": kind, "path": str(model_dir), **engine_cfg.get(kind, {})} for kind in kinds]
    settings = msgspec.convert({"logging": {"level": "WARNING"}, "models": models}, Settings)
    app = create_app(settings)
    with socket.socket() as sock:  # a free loopback port, chosen now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    task = asyncio.create_task(server.serve())
    t0 = time.time()
    registry = app.state.registry
    while not (server.started and registry.ready):
        if task.done() or any(s["state"] == "failed" for s in registry.statuses()):
            raise RuntimeError(f"gateway did not start: {registry.statuses()}")
        await asyncio.sleep(0.5)
    out: dict[str, Any] = {"start_s": time.time() - t0, "http": {}, "rows": []}
    log(f"gateway ready in {out['start_s']:.0f}s on :{port} with {kinds}")
    try:
        for kind in kinds:
            out["http"][kind] = {}
            for wl in ("d100", "d300"):
                n = 8 if small else (160 if wl == "d100" else 96)
                d = await _bench_http(f"http://127.0.0.1:{port}", kind, model_dir, wl, work / f"http-{kind}-{wl}", small, n)
                out["http"][kind][wl] = {"summaries": d["summaries"], "measured": d["measured"]}
                for s in d["summaries"]:
                    log(f"HTTP {kind} {wl} c={s['concurrency']}: {s['docs_per_s']:.0f} docs/s, p50 {s['latency_ms']['p50']:.1f} ms, "
                        f"p99 {s['latency_ms']['p99']:.1f} ms, timing {s.get('server_timing_ms')}, errors {s['errors']}")
        sizes = eb.SMALL_WORKLOADS if small else eb.WORKLOADS
        for i, kind in enumerate(kinds):
            score = eb.service_score(app.state.service, kind, RerankRequest)
            reqs = {wl: eb.make_requests(str(model_dir), wl, eb.WARMUP + r + eb.CLIENTS * pc, small, salt=101 + i)
                    for wl, (_, _, r, pc) in sizes.items()}
            out["rows"] += await eb.bench_variant(f"gateway service + {kind} (no HTTP)", score, reqs, lengths, cfg, tflops, small)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 120)
    return out


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
    tflops, device = eb.matmul_tflops()
    results.update(tflops=tflops, device=device, model_config={k: cfg.get(k) for k in REAL_CONFIG})
    log(f"matmul {tflops:.0f} TFLOP/s on {device}")
    lengths = eb.PromptLengths(str(model_dir))
    engine_cfg = json.loads(args.engine_config) if args.engine_config else (SMALL_ENGINES if args.small else GPU_ENGINES)
    results["engine_config"] = engine_cfg
    rows: list[dict[str, Any]] = []

    def save() -> None:
        results["rows"] = rows
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
        except Exception as exc:  # noqa: BLE001  # one failed variant must not lose the others' results
            results["errors"][name] = f"{type(exc).__name__}: {exc}"[:2000]
            log(f"ERROR in {name}: {results['errors'][name]}")
            return None
        finally:
            log(f"{name} took {time.time() - t0:.0f}s")
            save()

    phases = args.phases.split(",")
    kinds = args.http_engines.split(",")
    gw: dict[str, Any] = {"start_s": {}, "http": {}}
    # One gateway per engine kind, one after the other: two vLLM engines starting together on
    # one GPU each count the other's memory as taken, and the second finds no room for KV cache.
    for kind in kinds if "gateway" in phases else []:
        one = await phase(f"gateway {kind} (HTTP + in-process)", 150,
                          lambda kind=kind: phase_gateway(model_dir, [kind], engine_cfg, work, args.small, lengths, cfg, tflops))
        if one:
            rows += one.pop("rows", [])
            gw["start_s"][kind] = one["start_s"]
            gw["http"].update(one["http"])
            results["gateway"] = gw
    if gw["http"]:
        for kind in gw["http"]:  # 4 plots per engine at most: the device returns 8 files
            for png in ("latency_cdf.png", "throughput.png"):
                src = work / f"http-{kind}-d100" / png
                if src.exists():
                    shutil.copy(src, out_dir / f"{kind}_d100_{png}")

    async def raw_and_seed() -> None:
        llm = eb.raw_llm(str(model_dir), args.small, 0.05 if args.small else 0.3)
        single, pool = ThreadPoolExecutor(1), ThreadPoolExecutor(eb.CLIENTS)
        score, batch = eb.raw_score_fns(llm, single)
        rows.extend(await eb.bench_variant("raw LLM.score (text)", score, reqs(202), lengths, cfg, tflops, args.small,
                                           batch_many=batch))
        save()
        rows.extend(await eb.bench_variant("seed design (LLM.score behind a lock, batches of 100)", eb.seed_fn(llm, pool),
                                           reqs(303), lengths, cfg, tflops, args.small))
        single.shutdown()
        pool.shutdown()
        del llm  # its engine core process exits with it

    def reqs(salt: int) -> dict[str, list[eb.Request]]:
        sizes = eb.SMALL_WORKLOADS if args.small else eb.WORKLOADS
        return {wl: eb.make_requests(str(model_dir), wl, eb.WARMUP + r + eb.CLIENTS * pc, args.small, salt)
                for wl, (_, _, r, pc) in sizes.items()}

    async def ours(kind: str, salt: int) -> None:
        _, score, stop = await eb.gateway_service_variant(kind, str(model_dir), engine_cfg.get(kind, {}))
        try:
            rows.extend(await eb.bench_variant(f"gateway service + {kind}", score, reqs(salt), lengths, cfg, tflops, args.small))
        finally:
            await stop()

    if "raw" in phases:
        await phase("raw LLM.score + seed design", 120, raw_and_seed)
    if "transformers" in phases:
        await phase("transformers engine", 60, lambda: ours("transformers", 404))
    if "generate" in phases:
        await phase("vllm-generate engine", 110, lambda: ours("vllm-generate", 505))
    save()
    log("done; results in", out_dir)


def _targets(results: dict[str, Any], kind: str) -> list[str]:
    http = results.get("gateway", {}).get("http", {}).get(kind, {})

    def get(wl: str, c: int) -> dict[str, Any] | None:
        return next((s for s in http.get(wl, {}).get("summaries", []) if s["concurrency"] == c), None)

    lines = ["| target | goal | measured | verdict |", "|---|---|---|---|"]
    checks = [("d100, 16 clients over HTTP", "≥ 2,500 docs/s", get("d100", 16), "docs_per_s", 2500, True),
              ("d100, one request at idle, p99", "≤ 60 ms", get("d100", 1), "p99", 60, False),
              ("d300, 16 clients over HTTP", "≥ 1,200 docs/s", get("d300", 16), "docs_per_s", 1200, True)]
    for name, goal, s, key, bound, higher in checks:
        if s is None:
            lines.append(f"| {name} | {goal} | not run | – |")
            continue
        v = s["docs_per_s"] if key == "docs_per_s" else s["latency_ms"]["p99"]
        ok = v >= bound if higher else v <= bound
        miss = "met" if ok else f"missed by {abs(v - bound) / bound:.0%}"
        lines.append(f"| {name} | {goal} | {v:,.0f}{' ms' if key == 'p99' else ' docs/s'} | {miss} |")
    return lines


def report(results: dict[str, Any]) -> str:
    from gateway.bench.report import markdown_table

    env = results["environment"]
    lines = [f"# GPU benchmark ({results.get('device', '?')})", "",
             f"- date: {env['date_utc']}; host CPUs: {env['cpus']}; versions: "
             + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
             f"- model: random bf16 weights, Qwen3-Reranker-0.6B config {results.get('model_config')}",
             f"- matmul rate: {results.get('tflops', 0):,.0f} TFLOP/s",
             f"- engine config: {results.get('engine_config')}", ""]
    gw = results.get("gateway")
    for kind in (gw or {}).get("http", {}):
        lines += [f"## Targets, gateway over HTTP with {kind}", "", *_targets(results, kind), ""]
    for kind, by_wl in (gw or {}).get("http", {}).items():
        lines += [f"## Gateway over HTTP ({kind} engine)", "", f"engine ready {gw['start_s'][kind]:.0f}s after start", ""]
        for wl, d in by_wl.items():
            lines += [f"### {wl}", "", f"measured: {d['measured']}", "", markdown_table(d["summaries"])]
            # FLOPs per document from the in-process rows of the same workload (same lengths).
            ref = [r for r in results.get("rows", []) if r["workload"] == wl and r["docs_per_s"] > 0]
            if ref and results.get("tflops"):
                per_doc = sum(r["tflop_per_s"] / r["docs_per_s"] for r in ref) / len(ref)
                lines += ["MFU over HTTP (docs/s x model FLOPs per document / matmul rate): " + ", ".join(
                    f"{s['concurrency']} clients {100 * s['docs_per_s'] * per_doc / results['tflops']:.1f} %"
                    for s in d["summaries"]), ""]
    if results.get("rows"):
        lines += ["## Engine level (one process, no HTTP)", "", eb.markdown(results["rows"], results["tflops"], results["device"])]
    for k in ("skipped", "errors"):
        if results.get(k):
            lines += [f"## {k}", "", "```", json.dumps(results[k], indent=1), "```", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/gpu")
    ap.add_argument("--work", default="/tmp/rr-suite")
    ap.add_argument("--small", action="store_true", help="tiny model on CPU: a smoke test of this script")
    ap.add_argument("--phases", default="gateway,raw,transformers,generate", help="which phases to run")
    ap.add_argument("--http-engines", default="vllm-score", help="engine kinds the HTTP gateway serves (comma list)")
    ap.add_argument("--engine-config", default=os.environ.get("RR_ENGINE_CONFIG"),
                    help='JSON per engine kind, e.g. {"vllm-score": {"gpu_memory_utilization": 0.3}}')
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
