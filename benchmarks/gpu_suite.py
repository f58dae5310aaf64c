"""The GPU run: every variant in one process within a deadline (one device call, ~9 minutes).

    RR_BUDGET=520 RR_CMD="python3 -m benchmarks.gpu_suite" bash .gpu/device_run.sh

Phases, in order of importance (a phase that would pass the deadline is skipped and says so):

1. checkpoint: Qwen3-Reranker-0.6B's real config (28 layers, hidden 1024, 16/8 heads, head_dim
   128, MLP 3072, vocab 151,669, tied embeddings) with random bf16 weights -- weights do not
   change speed -- and the offline BPE tokenizer of ``tests.tiny_qwen3`` (lengths are cut in its
   tokens, so prompt lengths match the workload); bf16 matmul rate.
2. parity: the packed and transformers engines (fp32 and bf16), and packed split in a pipeline
   (over two GPUs, or one GPU and the CPU), against the independent reference (fp32, CPU) on the
   tiny and the 0.6B-shaped checkpoints; each gateway phase then scores the
   0.6B-shaped documents through its running engine too (vLLM engines included).
3. gateway over HTTP, one gateway per engine kind of ``--http-engines`` (packed, vllm-score,
   vllm-generate), one after the other: ``create_app`` + uvicorn in this process,
   ``rerank-gateway bench`` as a separate client process, one call per level (d100 and d300, 1
   and 16 clients) so the packed engine's queue/step counters are split per level. Kinds in
   ``--service-rows`` are also measured in-process (no HTTP), which gives FLOPs per document.
4. two GPUs (when the machine has them): the packed engine on ``["cuda:0"]``, as two replicas on
   ``["cuda:0", "cuda:1"]`` (data parallel), and as one model split over both (``split =
   "pipeline"``), d100 at 1 client (idle latency) and 32 clients each, with each GPU's memory;
   ``--twogpu-size 8b`` runs it on the 8B shape (``benchmarks.gpu_qwen3.SIZES``) instead.
   ``--small`` runs the same three contestants on ``cpu`` "devices" (the phase's logic on CPU).
5. raw offline ``LLM.score`` (and the seed's design with phase ``seed``); our transformers
   engine; our vllm-generate engine in-process (phases ``transformers``, ``generate``).

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
    # 64k-token steps: a lone d100 (~18.6k tokens) or d300 (~38.5k) request is one step.
    "packed": {"max_length": 2048, "max_query_tokens": 256, "batch_tokens": 65536},
    "transformers": {"max_length": 2048, "max_query_tokens": 256, "device": "cuda", "dtype": "bfloat16"},
}
_VLLM_CPU = {"max_length": 1024, "max_query_tokens": 256, "gpu_memory_utilization": 0.05, "enforce_eager": True}
SMALL_ENGINES: dict[str, dict[str, Any]] = {"vllm-score": _VLLM_CPU, "vllm-generate": _VLLM_CPU,
                                            "packed": {"max_length": 1024, "max_query_tokens": 256},
                                            "transformers": {"max_length": 1024, "max_query_tokens": 256}}
DEADLINE = float(os.environ.get("RR_DEADLINE") or 0) or time.time() + 3600


def log(*a: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] [suite]", *a, flush=True)


def left() -> float:
    return DEADLINE - time.time()


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
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


async def _bench_http(url: str, model: str, model_dir: Path, wl: str, out: Path, small: bool, requests: int,
                      concurrency: int) -> dict[str, Any]:
    docs, doc_tokens, _, _ = (eb.SMALL_WORKLOADS if small else eb.WORKLOADS)[wl]
    args = [sys.executable, "-m", "gateway", "bench", url, "--model", model, "--tokenizer", str(model_dir),
            "--documents", str(docs), "--doc-tokens", doc_tokens, "--query-tokens", "10", "--concurrency", str(concurrency),
            "--requests", str(requests), "--warmup", "4", "--seed", str({"d100": 11, "d300": 13}[wl] + concurrency),
            "--title", f"Gateway over HTTP, {wl}, {concurrency} clients", "--no-progress", "--out", str(out)]
    proc = await asyncio.create_subprocess_exec(*args)  # a separate process: the client's CPU is not ours
    if await proc.wait() != 0:
        raise RuntimeError(f"bench {wl} failed")
    return json.loads((out / "bench.json").read_text())


# Requests per (workload, clients): enough for a p99 and a few seconds of steady load.
HTTP_REQUESTS = {("d100", 1): 100, ("d100", 16): 160, ("d300", 1): 60, ("d300", 16): 96, ("d100", 32): 320}
DEFAULT_LEVELS = {"d100": (1, 16), "d300": (1, 16)}
# The 4B/8B shapes run ~5-10x slower per document: fewer requests keep a contestant near a minute.
LARGE_REQUESTS = {("d100", 1): 24, ("d100", 32): 96}


def two_gpu_contestants(small: bool) -> list[tuple[str, dict[str, Any]]]:
    """The two-GPU phase's packed configurations: one device, two replicas, one model split over two."""
    d0, d1 = ("cpu", "cpu") if small else ("cuda:0", "cuda:1")
    return [("packed-1gpu", {"devices": [d0]}),
            ("packed-2gpu", {"devices": [d0, d1]}),  # a whole replica per device, one queue
            ("packed-split", {"devices": [d0, d1], "split": "pipeline"})]  # layers halved, one step per stage


TWO_GPU_LEVELS = {"d100": (1, 32)}


def two_gpu_row(one: dict[str, Any], label: str) -> dict[str, Any]:
    """A contestant's idle latency and 32-client throughput out of its gateway phase."""
    by_c = {s["concurrency"]: s for s in one["http"][label]["d100"]["summaries"]}
    idle, load = by_c.get(1), by_c.get(32)
    return {"start_s": one["start_s"], "gpu_mib": one.get("gpu_mib"),
            "idle_p50_ms": idle["latency_ms"]["p50"] if idle else None,
            "idle_p99_ms": idle["latency_ms"]["p99"] if idle else None,
            "docs_per_s": load["docs_per_s"] if load else None, "errors": sum(sum(s["errors"].values()) for s in by_c.values()),
            "split": (one.get("engine_stats") or {}).get("split")}


def two_gpu_ratios(two: dict[str, Any]) -> dict[str, float]:
    """Against one GPU: throughput of two replicas (``speedup``, the issue's target) and of the split;
    the split's idle latency (a pipeline adds no parallelism to one request: ~1.0 expected)."""
    one, rep, split = (two.get(k) or {} for k in ("packed-1gpu", "packed-2gpu", "packed-split"))
    out: dict[str, float] = {}
    if one.get("docs_per_s") and rep.get("docs_per_s"):
        out["speedup"] = rep["docs_per_s"] / one["docs_per_s"]
    if one.get("docs_per_s") and split.get("docs_per_s"):
        out["split_speedup"] = split["docs_per_s"] / one["docs_per_s"]
    if one.get("idle_p50_ms") and split.get("idle_p50_ms"):
        out["split_idle_p50_ratio"] = split["idle_p50_ms"] / one["idle_p50_ms"]
    return out


def _engine_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """The packed engine's own counters over one bench level: queue wait vs steps."""
    if not before or not after or "steps" not in after:
        return None
    d = {k: after[k] - before[k] for k in ("requests", "steps", "queue_s_total", "finished", "engine_s_total")}
    items = sum(x["items"] for x in after["devices"]) - sum(x["items"] for x in before["devices"])
    tokens = sum(x["tokens"] for x in after["devices"]) - sum(x["tokens"] for x in before["devices"])
    busy = sum(x["busy_s"] for x in after["devices"]) - sum(x["busy_s"] for x in before["devices"])
    return {"requests": d["requests"], "steps": d["steps"],
            "queue_ms_per_request": 1e3 * d["queue_s_total"] / max(d["requests"], 1),
            # submit -> scores, minus the queue: time in steps (the request's own and others' items)
            "in_steps_ms_per_request": 1e3 * (d["engine_s_total"] - d["queue_s_total"]) / max(d["finished"], 1),
            "step_ms_mean": 1e3 * busy / max(d["steps"], 1), "items_per_step": items / max(d["steps"], 1),
            "tokens_per_step": tokens / max(d["steps"], 1),
            "device_busy_s": {x["device"] + f"#{i}": x["busy_s"] - y["busy_s"]
                              for i, (x, y) in enumerate(zip(after["devices"], before["devices"], strict=True))}}


async def phase_gateway(model_dir: Path, kind: str, engine_cfg: dict[str, Any], work: Path, small: bool,
                        lengths: Any, cfg: dict[str, Any], tflops: float, *, label: str | None = None,
                        levels: dict[str, tuple[int, ...]] = DEFAULT_LEVELS, service_rows: bool = True,
                        requests: dict[tuple[str, int], int] | None = None) -> dict[str, Any]:
    """One gateway serving one model of ``kind`` (named ``label``), over HTTP, then in-process."""
    import socket

    import uvicorn

    from gateway.app import create_app
    from schemas.config import Settings
    from schemas.rerank import RerankRequest

    label = label or kind
    models = [{"name": label, "engine": kind, "path": str(model_dir), **engine_cfg}]
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
    out: dict[str, Any] = {"start_s": time.time() - t0, "http": {label: {}}, "rows": []}
    mem = _gpu_mib()
    if mem:
        out["gpu_mib"] = {"ready": mem}
    log(f"gateway ready in {out['start_s']:.0f}s on :{port} with {label} ({kind})")

    def engine_stats() -> dict[str, Any] | None:
        return registry.statuses()[0].get("engine_stats")

    try:
        for wl, clients in levels.items():
            summaries, measured = [], None
            for c in clients:
                n = 8 if small else (requests or HTTP_REQUESTS)[(wl, c)]
                before = engine_stats()
                d = await _bench_http(f"http://127.0.0.1:{port}", label, model_dir, wl, work / f"http-{label}-{wl}-c{c}",
                                      small, n, c)
                delta = _engine_delta(before, engine_stats())
                for s in d["summaries"]:
                    s["engine"] = delta
                    log(f"HTTP {label} {wl} c={s['concurrency']}: {s['docs_per_s']:.0f} docs/s, p50 {s['latency_ms']['p50']:.1f} ms, "
                        f"p99 {s['latency_ms']['p99']:.1f} ms, timing {s.get('server_timing_ms')}, engine {delta}, errors {s['errors']}")
                summaries += d["summaries"]
                measured = d["measured"]
            out["http"][label][wl] = {"summaries": summaries, "measured": measured}
        out["engine_stats"] = engine_stats()
        if mem:
            out["gpu_mib"]["peak"] = _gpu_mib(peak=True)
        if PARITY_06B:
            score = eb.service_score(app.state.service, label, RerankRequest)
            got = [x for q, docs in PARITY_06B["reqs"] for x in await score((q, docs))]
            ref = PARITY_06B["reference"]
            order = sorted(range(len(ref)), key=lambda i: -ref[i])
            out["parity_0.6b_via_gateway"] = {"max_abs_diff_vs_reference": max(abs(a - b) for a, b in zip(got, ref, strict=True)),
                                             "same_order": sorted(range(len(got)), key=lambda i: -got[i]) == order,
                                             "score_range": [min(got), max(got)], "documents": len(got)}
            log(f"parity 0.6B shape via the gateway, {label}: {out['parity_0.6b_via_gateway']}")
        if service_rows:
            sizes = eb.SMALL_WORKLOADS if small else eb.WORKLOADS
            score = eb.service_score(app.state.service, label, RerankRequest)
            reqs = {wl: eb.make_requests(str(model_dir), wl, eb.WARMUP + r + eb.CLIENTS * pc, small, salt=101)
                    for wl, (_, _, r, pc) in sizes.items()}
            out["rows"] += await eb.bench_variant(f"gateway service + {label} (no HTTP)", score, reqs, lengths, cfg, tflops, small)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 120)
    return out


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


def _gpu_mib(peak: bool = False) -> list[int] | None:
    """Each GPU's memory held by this process's tensors (the engines run in-process), or its peak."""
    if "torch" not in sys.modules:
        return None
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    read = torch.cuda.max_memory_allocated if peak else torch.cuda.memory_allocated
    return [read(i) >> 20 for i in range(torch.cuda.device_count())]


# The 0.6B shape's parity requests and reference scores, kept by the parity phase so that each
# gateway phase can score them through its running engine (no second engine start).
PARITY_06B: dict[str, Any] = {}


def _worst(v: list[float], base: list[float], lens: list[int]) -> dict[str, Any]:
    i = max(range(len(v)), key=lambda j: abs(v[j] - base[j]))
    return {"worst_doc": {"index": i, "prompt_tokens": lens[i] if i < len(lens) else None, "score": v[i], "reference": base[i]}}


async def phase_parity(model_dir: Path, work: Path, small: bool) -> dict[str, Any]:
    """Scores of the packed engine (varlen on CUDA) and transformers against the independent reference.

    Two checkpoints: the tiny random one of the CPU tests (its scores spread over ~0.1, so the
    order is meaningful: the golden set) and the 0.6B-shaped one (random weights put every
    score near 0.5: only the numeric distance is meaningful there).
    """
    from adapters.base import ScoreJob
    from adapters.registry import build_engine
    from schemas.config import DEFAULT_INSTRUCTION, PackedEngineConfig, TransformersEngineConfig
    from tests.tiny_qwen3 import build_tiny_qwen3

    tiny = build_tiny_qwen3(work / "tiny")
    dev = "cpu" if small else "cuda"
    out: dict[str, Any] = {}
    # The 0.6B shape's reference runs on the CPU (fp32, one prompt at a time): 20 documents keep it short.
    for name, path, n_docs in (("tiny (golden order)", tiny, 100), ("0.6B shape", model_dir, 20)):
        reqs = [(q, docs[:n_docs]) for q, docs in eb.make_requests(str(path), "d100", 2, small, salt=999)]
        common = {"name": "p", "path": str(path), "max_length": 2048, "max_query_tokens": 256}
        configs = {
            "transformers fp32": TransformersEngineConfig(**common, device=dev, dtype="float32"),
            "transformers bf16": TransformersEngineConfig(**common, device=dev, dtype="bfloat16"),
            "packed fp32 (per-prompt sdpa)": PackedEngineConfig(**common, dtype="float32", attention="sdpa", compile="off"),
            # Compiled on the 0.6B shape only (what the gateway serves); the tiny one checks varlen eager.
            "packed bf16 (auto: varlen on CUDA)": PackedEngineConfig(**common, dtype="bfloat16",
                                                                     compile="off" if path == tiny else "auto"),
        }
        # One model split in a pipeline (layers halved): over two GPUs when there are two; with one,
        # its second stage on the CPU (eager: the CUDA path of a stage and the handover still run).
        split_devs, split_compile = (["cpu", "cpu"], "off") if small else (
            (["cuda:0", "cuda:1"], "auto") if _cuda_count() >= 2 else (["cuda:0", "cpu"], "off"))
        configs[f"packed bf16 split over {'+'.join(split_devs)}"] = PackedEngineConfig(
            **common, dtype="bfloat16", devices=tuple(split_devs), split="pipeline",
            compile="off" if path == tiny else split_compile)
        if path == tiny and not small:
            # The 2026-12-01 report's finding (transformers fp32 off by 0.44 on CUDA): the same engine
            # with SDPA's math kernel only, to tell the fused SDPA kernels from the engine's own code.
            configs["transformers fp32, SDPA math kernel only"] = configs["transformers fp32"]
        # The independent reference: full causal-LM forward per prompt, fp32, on the CPU -- in a
        # child process, so this process's CPU thread pools are never used before compiling.
        t = time.time()
        code = ("import json, sys; from tests import reference; reqs = json.load(sys.stdin); "
                "print(json.dumps([x for q, d in reqs for x in reference.score_texts(sys.argv[1], q, d)]))")
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(path), stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE)
        ref_out, _ = await proc.communicate(json.dumps(reqs).encode())
        scores: dict[str, list[float]] = {"reference (CPU fp32)": json.loads(ref_out.decode().strip().splitlines()[-1])}
        log(f"reference {name}: {time.time() - t:.0f}s")
        lens: list[int] = []
        errors: dict[str, str] = {}
        for label, c in configs.items():
            math_only = label.endswith("math kernel only")
            if math_only:
                import torch

                flags = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                         torch.backends.cuda.cudnn_sdp_enabled())
                torch.backends.cuda.enable_flash_sdp(False)
                torch.backends.cuda.enable_mem_efficient_sdp(False)
                torch.backends.cuda.enable_cudnn_sdp(False)
            try:
                eng = build_engine(c)
                await eng.start()
                try:
                    tok = eng.tokenizer
                    s: list[float] = []
                    lens = []
                    for q, docs in reqs:
                        shared = tok.encode_shared(q, DEFAULT_INSTRUCTION)
                        job = ScoreJob(query=q, instruction=DEFAULT_INSTRUCTION, shared_ids=shared, item_ids=tok.encode_documents(docs))
                        lens += [len(tok.assemble(shared, i)) for i in job.item_ids]
                        s += (await eng.score(job)).scores
                    scores[label] = s
                finally:
                    await eng.stop()
            except Exception as exc:  # noqa: BLE001  # one engine failing must not lose the others' parity
                errors[label] = f"{type(exc).__name__}: {exc}"[:500]
            finally:
                if math_only:
                    torch.backends.cuda.enable_flash_sdp(flags[0])
                    torch.backends.cuda.enable_mem_efficient_sdp(flags[1])
                    torch.backends.cuda.enable_cudnn_sdp(flags[2])
        base = scores["reference (CPU fp32)"]
        if path == model_dir:
            PARITY_06B["reqs"], PARITY_06B["reference"] = reqs, base

        def order(v: list[float]) -> list[int]:
            return sorted(range(len(v)), key=lambda i: -v[i])

        out[name] = {label: {"max_abs_diff_vs_reference": max(abs(a - b) for a, b in zip(v, base, strict=True)),
                             "same_order": order(v) == order(base),
                             "top10_same": order(v)[:10] == order(base)[:10],
                             "score_range": [min(v), max(v)],
                             # the worst document: index, its prompt's length in tokens, its two scores
                             **_worst(v, base, lens)}
                     for label, v in scores.items()}
        out[name].update({label: {"error": e} for label, e in errors.items()})
        log(f"parity {name}: {json.dumps(out[name])}")
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
    with_rows = set(args.service_rows.split(","))
    gw: dict[str, Any] = {"start_s": {}, "http": {}, "engine_stats": {}}
    if "parity" in phases:
        results["parity"] = await phase("parity (packed and transformers vs the reference)", 60,
                                        lambda: phase_parity(model_dir, work, args.small))
    if "twogpu" in phases:
        import torch

        n_gpu = torch.cuda.device_count()
        if not args.small and n_gpu < 2:
            results["skipped"].append(f"two GPUs: this machine has {n_gpu}")
        else:
            two: dict[str, Any] = {"size": "tiny (CPU devices)" if args.small else args.twogpu_size}
            two_dir, reqs2 = model_dir, None
            if args.twogpu_size != "0.6b" and not args.small:
                from benchmarks.gpu_qwen3 import SIZES

                two_dir = await asyncio.to_thread(build_checkpoint, work / f"qwen3-{args.twogpu_size}", False,
                                                  SIZES[args.twogpu_size])
                reqs2 = LARGE_REQUESTS
            for label, over in two_gpu_contestants(args.small):
                if torch.cuda.is_available():
                    for i in range(n_gpu):
                        torch.cuda.reset_peak_memory_stats(i)
                one = await phase(f"two GPUs: {label}", 90, lambda label=label, over=over: phase_gateway(
                    two_dir, "packed", {**engine_cfg.get("packed", {}), **over}, work, args.small, lengths,
                    cfg, tflops, label=label, levels=TWO_GPU_LEVELS, service_rows=False, requests=reqs2))
                if one:
                    two[label] = two_gpu_row(one, label)
            two.update(two_gpu_ratios(two))
            results["two_gpu"] = two
    # One gateway per engine kind, one after the other: two vLLM engines starting together on
    # one GPU each count the other's memory as taken, and the second finds no room for KV cache.
    for kind in kinds if "gateway" in phases else []:
        one = await phase(f"gateway {kind} (HTTP + in-process)", 150,
                          lambda kind=kind: phase_gateway(model_dir, kind, engine_cfg.get(kind, {}), work, args.small,
                                                          lengths, cfg, tflops, service_rows=kind in with_rows))
        if one:
            rows += one.pop("rows", [])
            gw["start_s"][kind] = one["start_s"]
            gw["http"].update(one["http"])
            gw["engine_stats"][kind] = one.get("engine_stats")
            if "parity_0.6b_via_gateway" in one:
                results.setdefault("parity_via_gateway", {})[kind] = one["parity_0.6b_via_gateway"]
            results["gateway"] = gw
    if gw["http"]:
        for kind in list(gw["http"])[:2]:  # 4 plots at most: the device returns 8 files
            for png in ("latency_cdf.png", "throughput.png"):
                src = work / f"http-{kind}-d100-c16" / png
                if src.exists():
                    shutil.copy(src, out_dir / f"{kind}_d100_{png}")

    async def raw_and_seed() -> None:
        llm = eb.raw_llm(str(model_dir), args.small, 0.05 if args.small else 0.3)
        single, pool = ThreadPoolExecutor(1), ThreadPoolExecutor(eb.CLIENTS)
        score, batch = eb.raw_score_fns(llm, single)
        rows.extend(await eb.bench_variant("raw LLM.score (text)", score, reqs(202), lengths, cfg, tflops, args.small,
                                           batch_many=batch))
        save()
        if "seed" in phases:
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
        await phase("raw LLM.score (+ seed design if asked)", 120, raw_and_seed)
    if "transformers" in phases:
        await phase("transformers engine", 60, lambda: ours("transformers", 404))
    if "generate" in phases:
        await phase("vllm-generate engine", 110, lambda: ours("vllm-generate", 505))
    save()
    log("done; results in", out_dir)


def _summary(results: dict[str, Any], kind: str, wl: str, c: int) -> dict[str, Any] | None:
    http = results.get("gateway", {}).get("http", {}).get(kind, {})
    return next((s for s in http.get(wl, {}).get("summaries", []) if s["concurrency"] == c), None)


# The targets: (name, goal, workload, clients, measure, bound, higher is better)
TARGETS = [("d100, one client at idle, p99", "≤ 60 ms", "d100", 1, "p99", 60, False),
           ("d100, one client at idle, p50", "≤ 50 ms", "d100", 1, "p50", 50, False),
           ("d100, 16 clients", "≥ 2,500 docs/s", "d100", 16, "docs_per_s", 2500, True),
           ("d100, 16 clients (stretch)", "≥ 3,000 docs/s", "d100", 16, "docs_per_s", 3000, True),
           ("d300, 16 clients", "≥ 1,300 docs/s", "d300", 16, "docs_per_s", 1300, True)]


def _value(s: dict[str, Any], key: str) -> float:
    return s["docs_per_s"] if key == "docs_per_s" else s["latency_ms"][key]


def _verdict(v: float, bound: float, higher: bool) -> str:
    ok = v >= bound if higher else v <= bound
    return "**met**" if ok else f"missed by {abs(v - bound) / bound:.0%}"


def _targets(results: dict[str, Any]) -> list[str]:
    kinds = list(results.get("gateway", {}).get("http", {}))
    lines = ["| target | goal | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for name, goal, wl, c, key, bound, higher in TARGETS:
        cells = []
        for kind in kinds:
            s = _summary(results, kind, wl, c)
            if s is None:
                cells.append("not run")
                continue
            v = _value(s, key)
            cells.append(f"{v:,.1f}{' ms' if key != 'docs_per_s' else ' docs/s'}: {_verdict(v, bound, higher)}")
        lines.append(f"| {name} | {goal} | " + " | ".join(cells) + " |")
    lines += [line + " – |" * (len(kinds) - 1) for line in two_gpu_target_lines(results.get("two_gpu") or {})]
    return lines


def two_gpu_target_lines(two: dict[str, Any]) -> list[str]:
    """The two-GPU rows of the targets table (two replicas: the target; the split: reported beside it)."""
    if "speedup" not in two:
        return ["| two GPUs, d100, 32 clients | ≥ 1.9× one GPU | not run (no second GPU in this run) |"]
    one, rep = two["packed-1gpu"], two["packed-2gpu"]
    lines = [f"| two GPUs, d100, 32 clients (packed, two replicas) | ≥ 1.9× one GPU | {rep['docs_per_s']:,.0f} vs "
             f"{one['docs_per_s']:,.0f} docs/s = {two['speedup']:.2f}×: {_verdict(two['speedup'], 1.9, True)} |"]
    if "split_speedup" in two:
        split = two["packed-split"]
        idle = (f"; idle p50 {split['idle_p50_ms']:.1f} vs {one['idle_p50_ms']:.1f} ms = {two['split_idle_p50_ratio']:.2f}×"
                if "split_idle_p50_ratio" in two else "")
        lines.append(f"| two GPUs, d100, 32 clients (packed, one model split in a pipeline) | reported | "
                     f"{split['docs_per_s']:,.0f} docs/s = {two['split_speedup']:.2f}× one GPU{idle} |")
    return lines


def _per_doc_tflop(results: dict[str, Any], wl: str) -> float | None:
    # Model FLOPs per document from the in-process rows of the same workload (same length distribution).
    ref = [r for r in results.get("rows", []) if r["workload"] == wl and r["docs_per_s"] > 0]
    return sum(r["tflop_per_s"] / r["docs_per_s"] for r in ref) / len(ref) if ref else None


def _split_table(results: dict[str, Any]) -> list[str]:
    """Mean time per request: tokenize / queue / compute / rest of the gateway / outside the server."""
    lines = ["| engine | workload | clients | latency mean ms | tokenize | queue (engine) | compute (engine) | "
             "rest of gateway | outside server | docs/s | MFU |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind, by_wl in results.get("gateway", {}).get("http", {}).items():
        for wl, d in by_wl.items():
            per_doc = _per_doc_tflop(results, wl)
            for s in d["summaries"]:
                t = s.get("server_timing_ms") or {}
                eng = s.get("engine") or {}
                inf = t.get("inference", float("nan"))
                queue = eng.get("queue_ms_per_request")
                compute = f"{eng['in_steps_ms_per_request']:.1f}" if queue is not None else f"{inf:.1f} (queue not reported)"
                rest = t.get("process", float("nan")) - t.get("tokenize", float("nan")) - inf
                mfu = f"{100 * s['docs_per_s'] * per_doc / results['tflops']:.1f} %" if per_doc and results.get("tflops") else "–"
                lines.append(f"| {kind} | {wl} | {s['concurrency']} | {s['latency_ms']['mean']:.1f} | {t.get('tokenize', float('nan')):.1f} | "
                             f"{'–' if queue is None else f'{queue:.1f}'} | {compute} | {rest:.1f} | {t.get('outside_server', float('nan')):.1f} | "
                             f"{s['docs_per_s']:,.0f} | {mfu} |")
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
    lines += ["## Targets (one H200 unless said, over HTTP through the gateway)", "", *_targets(results), ""]
    if gw:
        lines += ["## Where the time goes (means per request)", "",
                  "Queue = from the engine call to the first step holding one of the request's items (packed engine's "
                  "own counters, warm-up requests included); compute = from there to the last score. For vLLM engines compute "
                  "is the whole engine call. MFU = docs/s x model FLOPs per document "
                  "/ the matmul rate measured in this run.", "", *_split_table(results), ""]
    if results.get("parity"):
        lines += ["## Parity on this device (against the independent reference, fp32 on the CPU, same prompts)", "", "```",
                  json.dumps(results["parity"], indent=1), "```", ""]
    if results.get("parity_via_gateway"):
        lines += ["## Parity through the gateway (0.6B shape, the parity phase's documents, each engine as served)", "",
                  "| engine | max abs diff vs reference | same order | documents |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['max_abs_diff_vs_reference']:.2e} | {v['same_order']} | {v['documents']} |"
                  for k, v in results["parity_via_gateway"].items()]
        lines.append("")
    if results.get("gateway", {}).get("engine_stats", {}).get("packed"):
        st = results["gateway"]["engine_stats"]["packed"]
        lines += ["## Packed engine as served", "", "```", json.dumps({k: st.get(k) for k in ("attention", "compiled", "mode", "silu",
                  "compile_error", "steps", "step_ms_mean", "steps_by_requests")}, default=str), "```", ""]
    if results.get("two_gpu"):
        lines += ["## Two GPUs (packed engine: one GPU, two replicas, one model split; d100 at 1 and 32 clients)", "", "```", json.dumps(results["two_gpu"], indent=1, default=str), "```", ""]
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
    ap.add_argument("--phases", default="parity,gateway,twogpu,raw,transformers,generate", help="which phases to run")
    ap.add_argument("--twogpu-size", default="0.6b", choices=("0.6b", "4b", "8b"),
                    help="the model shape of phase twogpu (4b/8b: benchmarks.gpu_qwen3's real configs, random weights)")
    ap.add_argument("--http-engines", default="packed,vllm-score,vllm-generate",
                    help="engine kinds the HTTP gateway serves, one gateway each (comma list)")
    ap.add_argument("--service-rows", default="packed", help="kinds also measured in-process (no HTTP) after HTTP")
    ap.add_argument("--engine-config", default=os.environ.get("RR_ENGINE_CONFIG"),
                    help='JSON per engine kind, e.g. {"vllm-score": {"gpu_memory_utilization": 0.3}}')
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
