"""Engine-level benchmark in one process: the same requests through each way of scoring them.

Variants (``--variants``, comma-separated):

- ``vllm-score``, ``vllm-generate``, ``transformers``: our engines behind the gateway's own
  ``RerankService`` (tokenization with cached template parts, dedup, truncation, engine call),
  everything but HTTP. Concurrent clients are concurrent coroutines.
- ``raw-score``: offline ``vllm.LLM.score(query_text, doc_texts)`` on the same prompts as text
  (template applied by string, as a user of the raw engine would); 16 clients = the 16 requests'
  pairs in one call, the best an offline caller can do.
- ``seed``: the seed's design: that offline ``LLM`` behind a lock, each request deduped, sorted
  by length and scored in serial batches of ``infer_batch_size`` (100), 16 callers in threads.

Workloads: ``d100`` = 1 query x 100 documents of U[50,150] tokens, ``d300`` = U[150,450], the
standard instruction; each request alone (sequential) and from 16 concurrent clients. Reports
docs/s, tokens/s (whole prompts: template + query + document) and model FLOP utilization against
a matmul rate measured here (bf16 8192^3 on CUDA; fp32 on CPU).

    python -m benchmarks.engine_bench --model DIR --variants vllm-score,raw-score,seed --out OUT

``--cpu-compare`` instead puts the packed engine beside the padded transformers engine on CPU
at several request sizes, on the tiny test model and on a model of Qwen3-Reranker-0.6B's shape
(fp32, random weights, the tiny tokenizer's vocabulary), requests alternating between the
engines so both see the same machine load; writes ``cpu_compare.json`` and ``cpu_compare.md``:

    python -m benchmarks.engine_bench --cpu-compare --out docs/benchmarks/cpu-2026-12-01-packed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from gateway.bench.report import percentile
from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter
from schemas.config import DEFAULT_INSTRUCTION

__all__ = ("WORKLOADS", "bench_variant", "flops_per_prompt", "make_requests", "matmul_tflops")

HF_OVERRIDES = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                "is_original_qwen3_reranker": True}
# name -> (documents, doc tokens, sequential reps, requests per client at 16 clients)
WORKLOADS: dict[str, tuple[int, str, int, int]] = {"d100": (100, "50-150", 10, 4), "d300": (100, "150-450", 6, 2)}
SMALL_WORKLOADS: dict[str, tuple[int, str, int, int]] = {"d100": (10, "20-40", 3, 1), "d300": (10, "40-80", 2, 1)}
CLIENTS = 16
WARMUP = 2

Request = tuple[str, list[str]]
ScoreFn = Callable[[Request], Awaitable[list[float]]]


def make_requests(model_dir: str, name: str, count: int, small: bool = False, salt: int = 0) -> list[Request]:
    """Fresh requests per ``salt``: each variant gets its own, so no prefix cache carries over."""
    docs, doc_tokens, _, _ = (SMALL_WORKLOADS if small else WORKLOADS)[name]
    spec = WorkloadSpec(requests=count, documents=docs, doc_tokens=doc_tokens, query_tokens="10",
                        seed={"d100": 100, "d300": 300}[name] + 7919 * salt)
    out = []
    for r in build_workload(spec, load_token_counter(model_dir)):
        body = msgspec.json.decode(r.body)
        out.append((body["query"], body["documents"]))
    return out


def flops_per_prompt(length: int, cfg: dict[str, Any]) -> float:
    """Forward FLOPs of one prompt: 2 x non-embedding weights x tokens + causal attention."""
    d_attn = cfg["num_attention_heads"] * cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    d_kv = cfg["num_key_value_heads"] * cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    h, f, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    per_layer = h * d_attn + 2 * h * d_kv + d_attn * h + 3 * h * f
    return 2 * per_layer * layers * length + 2 * d_attn * length * (length + 1) * layers


def matmul_tflops() -> tuple[float, str]:
    """Median dense matmul rate of this device (what MFU is measured against)."""
    import torch

    if torch.cuda.is_available():
        n, dtype, dev = 8192, torch.bfloat16, "cuda"
    else:
        n, dtype, dev = 1024, torch.float32, "cpu"
    a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    times = []
    for i in range(25):
        if dev == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            a @ b
            e1.record()
            e1.synchronize()
            dt = e0.elapsed_time(e1) / 1e3
        else:
            t = time.perf_counter()
            a @ b
            dt = time.perf_counter() - t
        if i >= 5:
            times.append(dt)
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    return 2 * n**3 / statistics.median(times) / 1e12, f"{name} {str(dtype).replace('torch.', '')} {n}^3"


class PromptLengths:
    """Whole-prompt token counts (template + instruction + query + document + suffix)."""

    def __init__(self, model_dir: str) -> None:
        from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer

        self.tok = Qwen3PromptTokenizer(load_hf_tokenizer(model_dir), max_length=8192, max_query_tokens=2048)

    def of(self, req: Request) -> list[int]:
        shared = len(self.tok.encode_shared(req[0], DEFAULT_INSTRUCTION))
        return [shared + len(ids) + self.tok.suffix_length for ids in self.tok.encode_documents(req[1])]

    def shared(self, req: Request) -> int:
        return len(self.tok.encode_shared(req[0], DEFAULT_INSTRUCTION))


async def bench_variant(
    name: str, score: ScoreFn, requests: dict[str, list[Request]], lengths: PromptLengths,
    cfg: dict[str, Any], tflops: float, small: bool = False, batch_score: ScoreFn | None = None,
    batch_many: Callable[[list[Request]], Awaitable[None]] | None = None,
) -> list[dict[str, Any]]:
    """Alone (sequential) and 16 clients, per workload. ``batch_many`` replaces concurrent
    clients for offline engines (one call holding all 16 requests)."""
    rows = []
    timings = getattr(score, "timings", None)  # gateway service: (tokenize ms, inference ms) per request

    def split(since: int) -> dict[str, float] | None:
        new = timings[since:] if timings is not None else []
        if not new:
            return None
        return {"tokenize_ms": sum(a for a, _ in new) / len(new), "inference_ms": sum(b for _, b in new) / len(new)}

    for wl, reqs in requests.items():
        _, _, reps, per_client = (SMALL_WORKLOADS if small else WORKLOADS)[wl]
        for r in reqs[:WARMUP]:
            await score(r)
        seq = reqs[WARMUP : WARMUP + reps]
        mark = len(timings) if timings is not None else 0
        lat = []
        for r in seq:
            t = time.perf_counter()
            scores = await score(r)
            lat.append(time.perf_counter() - t)
            if len(scores) != len(r[1]) or not all(0.0 <= s <= 1.0 for s in scores):
                raise RuntimeError(f"{name}: bad scores {scores[:5]}...")
        rows.append(_row(name, wl, "alone", seq, lat, sum(lat), lengths, cfg, tflops) | {"service_split": split(mark)})
        mark = len(timings) if timings is not None else 0
        conc = reqs[WARMUP + reps : WARMUP + reps + CLIENTS * per_client]
        clat: list[float] = []
        t0 = time.perf_counter()
        if batch_many is not None:
            for k in range(per_client):
                t = time.perf_counter()
                await batch_many(conc[k * CLIENTS : (k + 1) * CLIENTS])
                clat += [time.perf_counter() - t] * CLIENTS
            mode = f"{CLIENTS} requests per call"
        else:
            async def client(mine: list[Request], out: list[float]) -> None:
                for r in mine:
                    t = time.perf_counter()
                    await score(r)
                    out.append(time.perf_counter() - t)

            await asyncio.gather(*(client(conc[i::CLIENTS], clat) for i in range(CLIENTS)))
            mode = f"{CLIENTS} clients"
        rows.append(_row(name, wl, mode, conc, clat, time.perf_counter() - t0, lengths, cfg, tflops)
                    | {"service_split": split(mark)})
        print(json.dumps({k: rows[-2][k] for k in ("variant", "workload", "load", "docs_per_s", "p50_ms")}),
              json.dumps({k: rows[-1][k] for k in ("variant", "workload", "load", "docs_per_s", "mfu")}), flush=True)
    return rows


def _row(name: str, wl: str, load: str, reqs: list[Request], lat: list[float], wall: float,
         lengths: PromptLengths, cfg: dict[str, Any], tflops: float) -> dict[str, Any]:
    prompt_lens = [n for r in reqs for n in lengths.of(r)]
    flops = sum(flops_per_prompt(n, cfg) for n in prompt_lens)
    lat_ms = sorted(x * 1e3 for x in lat)
    return {
        "variant": name, "workload": wl, "load": load, "requests": len(reqs), "wall_s": wall,
        "docs_per_s": sum(len(r[1]) for r in reqs) / wall, "tokens_per_s": sum(prompt_lens) / wall,
        "tflop_per_s": flops / wall / 1e12, "mfu": flops / wall / 1e12 / tflops,
        "p50_ms": percentile(lat_ms, 50), "p99_ms": percentile(lat_ms, 99), "max_ms": lat_ms[-1],
        "prompt_tokens_per_request": sum(prompt_lens) / len(reqs), "shared_prefix_tokens": lengths.shared(reqs[0]),
    }


# -- our engines through the gateway's service -----------------------------------------------------
async def gateway_service_variant(kind: str, model_dir: str, extra: dict[str, Any]) -> tuple[Any, ScoreFn, Callable[[], Awaitable[None]]]:
    from gateway.serving.models import ModelRegistry
    from gateway.serving.service import RerankService
    from schemas.config import Settings
    from schemas.rerank import RerankRequest

    settings = msgspec.convert({"models": [{"name": kind, "engine": kind, "path": model_dir, **extra}]}, Settings)
    registry = ModelRegistry(settings)
    registry.start()
    await registry.wait_loaded()
    if not registry.ready:
        await registry.stop()
        raise RuntimeError(f"{kind} failed to load: {registry.statuses()}")
    service = RerankService(registry, settings.limits)
    return registry, service_score(service, kind, RerankRequest), registry.stop


def service_score(service: Any, model: str, request_type: Any) -> ScoreFn:
    counter = iter(range(1 << 62))
    timings: list[tuple[float, float]] = []

    async def score(req: Request) -> list[float]:
        out = await service.rerank(request_type(query=req[0], documents=req[1], model=model),
                                   api_version="2", request_id=f"bench-{next(counter)}")
        timings.append((out.tokenize_ms, out.inference_ms))
        by_index = {r.index: r.relevance_score for r in out.response.results}
        return [by_index[i] for i in range(len(req[1]))]

    score.timings = timings  # type: ignore[attr-defined]  # (tokenize ms, inference ms) per request
    return score


# -- raw offline vLLM and the seed's design --------------------------------------------------------
def raw_llm(model_dir: str, small: bool, gpu_util: float) -> Any:
    from vllm import LLM

    kw: dict[str, Any] = dict(model=model_dir, max_model_len=2048, seed=0, enable_prefix_caching=True,
                              gpu_memory_utilization=gpu_util, runner="pooling", hf_overrides=HF_OVERRIDES)
    if small:
        kw.update(enforce_eager=True, dtype="float32")
    else:
        kw.update(dtype="bfloat16")
    return LLM(**kw)


def _texts(req: Request) -> tuple[str, list[str]]:
    from adapters.families.qwen3 import PREFIX, SUFFIX

    query = f"{PREFIX}<Instruct>: {DEFAULT_INSTRUCTION}\n<Query>: {req[0]}\n"
    return query, [f"<Document>: {d}{SUFFIX}" for d in req[1]]


def raw_score_fns(llm: Any, pool: ThreadPoolExecutor) -> tuple[ScoreFn, Callable[[list[Request]], Awaitable[None]]]:
    def one(req: Request) -> list[float]:
        q, docs = _texts(req)
        return [o.outputs.score for o in llm.score(q, docs, use_tqdm=False)]

    def many(reqs: list[Request]) -> None:
        qs, ds = [], []
        for r in reqs:
            q, docs = _texts(r)
            qs += [q] * len(docs)
            ds += docs
        llm.score(qs, ds, use_tqdm=False)

    loop = asyncio.get_running_loop()

    async def score(req: Request) -> list[float]:
        return await loop.run_in_executor(pool, one, req)

    async def batch(reqs: list[Request]) -> None:
        await loop.run_in_executor(pool, many, reqs)

    return score, batch


def seed_fn(llm: Any, pool: ThreadPoolExecutor, infer_batch_size: int = 100) -> ScoreFn:
    """The seed: one lock around the offline engine; dedup, length sort, serial batches."""
    lock = threading.Lock()

    def one(req: Request) -> list[float]:
        q, docs = _texts(req)
        unique = list(dict.fromkeys(docs))
        order = sorted(range(len(unique)), key=lambda i: len(unique[i]))
        scores: dict[str, float] = {}
        with lock:
            for k in range(0, len(order), infer_batch_size):
                batch = [unique[i] for i in order[k : k + infer_batch_size]]
                for d, o in zip(batch, llm.score(q, batch, use_tqdm=False), strict=True):
                    scores[d] = o.outputs.score
        return [scores[d] for d in docs]

    loop = asyncio.get_running_loop()

    async def score(req: Request) -> list[float]:
        return await loop.run_in_executor(pool, one, req)

    return score


def markdown(rows: list[dict[str, Any]], tflops: float, device: str) -> str:
    lines = [f"Matmul rate measured here: {tflops:,.2f} TFLOP/s ({device}); MFU = model FLOPs / that rate.", "",
             "| variant | workload | load | docs/s | tokens/s | MFU | p50 ms | p99 ms | prompt tokens/request | tokenize / engine ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = r.get("service_split")
        split = f"{sp['tokenize_ms']:.1f} / {sp['inference_ms']:.1f}" if sp else "–"
        lines.append(f"| {r['variant']} | {r['workload']} | {r['load']} | {r['docs_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
                     f"{100 * r['mfu']:.1f} % | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['prompt_tokens_per_request']:,.0f} | {split} |")
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    tflops, device = matmul_tflops()
    print(f"matmul: {tflops:.1f} TFLOP/s on {device}", flush=True)
    lengths = PromptLengths(args.model)
    sizes = SMALL_WORKLOADS if args.small else WORKLOADS

    def requests_for(salt: int) -> dict[str, list[Request]]:
        return {wl: make_requests(args.model, wl, WARMUP + reps + CLIENTS * pc, args.small, salt)
                for wl, (_, _, reps, pc) in sizes.items()}

    rows: list[dict[str, Any]] = []
    variants = args.variants.split(",")
    extra = json.loads(args.engine_config) if args.engine_config else {}
    for kind in ("packed", "vllm-score", "vllm-generate", "transformers"):
        if kind in variants:
            _, score, stop = await gateway_service_variant(kind, args.model, extra.get(kind, {}))
            try:
                rows += await bench_variant(f"gateway service + {kind}", score, requests_for(len(rows)), lengths, cfg, tflops, args.small)
            finally:
                await stop()
    if {"raw-score", "seed"} & set(variants):
        llm = raw_llm(args.model, args.small, args.gpu_util)
        with ThreadPoolExecutor(CLIENTS) as pool:
            if "raw-score" in variants:
                single = ThreadPoolExecutor(1)  # the offline engine is not thread-safe
                score, batch = raw_score_fns(llm, single)
                rows += await bench_variant("raw LLM.score (text)", score, requests_for(len(rows)), lengths, cfg, tflops, args.small,
                                            batch_many=batch)
                single.shutdown()
            if "seed" in variants:
                rows += await bench_variant("seed design (lock, batches of 100)", seed_fn(llm, pool), requests_for(len(rows)),
                                            lengths, cfg, tflops, args.small)
        del llm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_bench.json").write_text(json.dumps({"tflops": tflops, "device": device, "rows": rows}, indent=1))
    (out / "engine_bench.md").write_text(markdown(rows, tflops, device))
    print(markdown(rows, tflops, device), flush=True)
    return rows


# -- packed vs padded on CPU ------------------------------------------------------------------------
# model -> [(documents, document tokens, sequential repetitions)]; the 0.6B shape is slow on 2 cores.
CPU_SIZES: dict[str, list[tuple[int, str, int]]] = {
    "tiny": [(1, "50-150", 20), (10, "50-150", 10), (100, "50-150", 5), (100, "150-450", 3)],
    "0.6b-shape": [(1, "50-150", 2), (4, "50-150", 2)],
}
CPU_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "transformers (padded)": ("transformers", {"dtype": "float32", "device": "cpu"}),
    "packed": ("packed", {"dtype": "float32", "devices": ["cpu"]}),
}


def build_cpu_models(work: Path) -> dict[str, str]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.tiny_qwen3 import build_tiny_qwen3

    tiny = build_tiny_qwen3(work / "tiny")
    shaped = build_tiny_qwen3(work / "shape06b", vocab_size=2048)
    small_cfg = json.loads((shaped / "config.json").read_text())
    cfg = Qwen3Config(vocab_size=small_cfg["vocab_size"], hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      rope_theta=1000000.0, tie_word_embeddings=True, eos_token_id=small_cfg.get("eos_token_id"),
                      pad_token_id=small_cfg.get("pad_token_id"))
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(shaped)
    return {"tiny": str(tiny), "0.6b-shape": str(shaped)}


async def cpu_compare(work: Path, out: Path, models: list[str], clients: int = 4) -> list[dict[str, Any]]:
    paths = build_cpu_models(work)
    rows: list[dict[str, Any]] = []
    for model in models:
        engines = {}
        for label, (kind, extra) in CPU_VARIANTS.items():
            engines[label] = await gateway_service_variant(
                kind, paths[model], {"max_length": 2048, "max_query_tokens": 256, "timeout_s": 1800, **extra})
        try:
            for docs, doc_tokens, reps in CPU_SIZES[model]:
                spec = WorkloadSpec(requests=1 + reps + clients, documents=docs, doc_tokens=doc_tokens, query_tokens="10",
                                    seed=docs * 31 + len(doc_tokens))
                reqs = [(b["query"], b["documents"]) for b in
                        (msgspec.json.decode(r.body) for r in build_workload(spec, load_token_counter(paths[model])))]
                lat: dict[str, list[float]] = {label: [] for label in engines}
                scores: dict[str, list[float]] = {}
                for label, (_, score, _) in engines.items():
                    scores[label] = await score(reqs[0])  # warm-up; also the parity check below
                for r in reqs[1 : 1 + reps]:
                    for label, (_, score, _) in engines.items():  # alternate: same load for both
                        t = time.perf_counter()
                        await score(r)
                        lat[label].append(time.perf_counter() - t)
                conc: dict[str, float] = {}
                if model == "tiny":
                    for label, (_, score, _) in engines.items():
                        t = time.perf_counter()
                        await asyncio.gather(*(score(r) for r in reqs[1 + reps :]))
                        conc[label] = time.perf_counter() - t
                diff = max(abs(a - b) for a, b in zip(*scores.values(), strict=True))
                for label in engines:
                    ms = sorted(x * 1e3 for x in lat[label])
                    rows.append({"model": model, "documents": docs, "doc_tokens": doc_tokens, "variant": label,
                                 "p50_ms": percentile(ms, 50), "mean_ms": sum(ms) / len(ms), "reps": len(ms),
                                 "docs_per_s": docs * len(ms) / (sum(ms) / 1e3),
                                 f"{clients}_clients_docs_per_s": (docs * clients / conc[label]) if label in conc else None,
                                 "max_abs_score_diff": diff})
                    print(json.dumps(rows[-1]), flush=True)
                _write_cpu_compare(rows, clients, out)  # after every size: a slow machine keeps what it measured
        finally:
            for _, _, stop in engines.values():
                await stop()
    return _write_cpu_compare(rows, clients, out)


def _write_cpu_compare(rows: list[dict[str, Any]], clients: int, out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_compare.json").write_text(json.dumps({"rows": rows, "clients": clients}, indent=1))
    lines = ["| model | documents x tokens | variant | p50 ms (sequential) | mean ms | docs/s | "
             f"{clients} clients docs/s | packed / padded time | max score diff |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pair = [x for x in rows if x["model"] == r["model"] and x["documents"] == r["documents"] and x["doc_tokens"] == r["doc_tokens"]]
        padded = next(x for x in pair if x["variant"].startswith("transformers"))
        c = r[f"{clients}_clients_docs_per_s"]
        lines.append(f"| {r['model']} | {r['documents']} x {r['doc_tokens']} | {r['variant']} | {r['p50_ms']:.1f} | {r['mean_ms']:.1f} | "
                     f"{r['docs_per_s']:,.1f} | {'–' if c is None else f'{c:,.1f}'} | {r['mean_ms'] / padded['mean_ms']:.2f} | "
                     f"{r['max_abs_score_diff']:.1e} |")
    (out / "cpu_compare.md").write_text("\n".join(lines) + "\n")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="Qwen3-Reranker checkpoint directory (required unless --cpu-compare)")
    ap.add_argument("--cpu-compare", action="store_true", help="packed vs padded transformers on CPU (builds its models)")
    ap.add_argument("--cpu-models", default="tiny,0.6b-shape", help="--cpu-compare: which models")
    ap.add_argument("--work", default="/tmp/rr-cpu-compare", help="--cpu-compare: where the models are built")
    ap.add_argument("--variants", default="packed,vllm-score,vllm-generate,transformers,raw-score,seed")
    ap.add_argument("--engine-config", help='JSON: extra config per engine kind, e.g. {"vllm-score": {...}}')
    ap.add_argument("--gpu-util", type=float, default=0.3, help="raw LLM gpu_memory_utilization")
    ap.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    ap.add_argument("--out", default="bench-out/engine")
    args = ap.parse_args()
    if args.cpu_compare:
        asyncio.run(cpu_compare(Path(args.work), Path(args.out), args.cpu_models.split(",")))
    elif not args.model:
        ap.error("--model is required")
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
