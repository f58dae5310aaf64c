"""Side-by-side timing of the packed engine's forward variants on one GPU (device-call script).

``python -m benchmarks.packed_variants --out DIR`` runs, each in a child process with its own
time limit (a variant that fails or stalls in compilation is recorded and skipped, not fatal):

- ``variant:<name>``: Qwen3-Reranker-0.6B's shape, random bf16 weights, in memory; the replica of
  ``adapters.runtimes.packed.forward`` in that variant's mode / attention kernel / compilation.
  Times a d100 request (one 18.6k-token step, host packing and the score read included: what
  the engine does per step), d300 (38.5k), and a 16-client-like stream of 62k-token steps run
  pipelined (step k+1 launched before step k is read, as the scheduler does); a torch.profiler
  kernel-time split of the d100 step; parity of the same variant on the tiny test checkpoint
  against the fp32 CPU reference.
- ``tf-fp32``: the transformers engine's padded forward in fp32 on CUDA vs the reference, with
  sdpa / eager attention, left-padded batches vs one row at a time, SDPA backends pinned.

Results go to ``DIR/variants.json`` after every child, and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_suite import REAL_CONFIG

# name: (mode, compile, varlen kernel[, vLLM's silu / q-k-norm-RoPE kernels when faster at start])
VARIANTS: dict[str, tuple[Any, ...]] = {
    "modules+whole+torch (run 1)": ("modules", True, "torch"),
    "fused+regions+fa3": ("fused", True, "fa3"),
    "fused+regions+torch": ("fused", True, "torch"),
    "modules+whole+fa3": ("modules", True, "fa3"),
    "fused+eager+fa3": ("fused", False, "fa3"),
    "fused+regions+fa3 (no vLLM ops)": ("fused", True, "fa3", False),
}
FLOP_PER_TOKEN = 0.90e9
DEV = os.environ.get("RR_VARIANT_DEVICE", "cuda")  # "cpu": a dry run of the script


def _sync() -> None:
    import torch

    if DEV == "cuda":
        torch.cuda.synchronize()


def _batch(n_docs: int, lo: int, hi: int, seed: int, prefix: int = 86) -> list[list[int]]:
    import random

    rnd = random.Random(seed)
    shared = [rnd.randrange(100, 2000) for _ in range(prefix - 10)]
    suffix = [rnd.randrange(100, 2000) for _ in range(10)]
    return [shared + [rnd.randrange(100, 2000) for _ in range(rnd.randint(lo, hi))] + suffix for _ in range(n_docs)]


def _flops(prompts: list[list[int]], layers: int = 28, heads: int = 16, dim: int = 128) -> float:
    return sum(FLOP_PER_TOKEN * len(p) + layers * 4 * heads * dim * len(p) ** 2 / 2 for p in prompts)


def _tiny_parity(work: Path, mode: str, compile_: bool, kernel: str, dtype: Any) -> dict[str, Any]:
    import torch

    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
    from adapters.runtimes.packed.forward import PackedQwen3Replica, load_backbone
    from tests import reference
    from tests.tiny_qwen3 import build_tiny_qwen3

    tiny = build_tiny_qwen3(work / "tiny")
    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny), None), max_length=512, max_query_tokens=64)
    docs = [f"document {i}: " + "the capital of a country is a city " * (i % 7) + str(i * 7919) for i in range(60)]
    shared = tok.encode_shared("What is the capital of the United States?", reference.DEFAULT_INSTRUCTION)
    prompts = [tok.assemble(shared, d) for d in tok.encode_documents(docs)]
    ref = reference.score_ids(str(tiny), prompts)
    backbone, head = load_backbone(str(tiny), None, dtype, (tok.no_id, tok.yes_id))
    attention = "sdpa" if dtype == torch.float32 else "varlen"
    rep = PackedQwen3Replica(backbone, head, torch.device(DEV), attention=attention, compile=compile_ and DEV == "cuda", mode=mode, kernel=kernel)
    rep.warm_up([prompts[:1], prompts])
    got = rep.score(prompts)

    def order(v: list[float]) -> list[int]:
        return sorted(range(len(v)), key=lambda i: -v[i])

    return {"attention": rep.attention_name, "max_abs_diff": max(abs(a - b) for a, b in zip(got, ref, strict=True)),
            "same_order": order(got) == order(ref), "compile_error": rep.compile_error}


def run_variant(name: str, work: Path) -> dict[str, Any]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from adapters.runtimes.packed.forward import PackedQwen3Replica

    mode, compile_, kernel, *rest = VARIANTS[name]
    vllm_ops = rest[0] if rest else True
    out: dict[str, Any] = {"variant": name}
    torch.manual_seed(0)
    cfg = (dict(REAL_CONFIG, num_hidden_layers=2, vocab_size=4096, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32) if DEV == "cpu" else REAL_CONFIG)  # CPU: a dry run
    with torch.device(DEV):
        model = Qwen3ForCausalLM(Qwen3Config(**cfg)).to(torch.bfloat16 if DEV == "cuda" else torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    head = model.lm_head.weight[[1, 2]].float().clone()
    rep = PackedQwen3Replica(model.model, head, torch.device(DEV), attention="varlen" if DEV == "cuda" else "sdpa", compile=compile_ and DEV == "cuda", mode=mode, kernel=kernel, vllm_ops=vllm_ops)
    out["attention"] = rep.attention_name
    d100, d300 = _batch(100, 50, 150, 1), _batch(100, 150, 450, 2)
    # 16 clients' d100 requests in the engine's 64k-token steps: ~3.3 requests per step.
    stream = [_batch(100, 50, 150, 10 + i) for i in range(16 if DEV == "cuda" else 2)]
    flat = [p for b in stream for p in b]
    steps, cur, tokens = [], [], 0
    for p in flat:
        if cur and tokens + len(p) > 65536:
            steps.append(cur)
            cur, tokens = [], 0
        cur.append(p)
        tokens += len(p)
    steps.append(cur)
    t = time.time()
    rep.warm_up([d100[:1], d100, d300, steps[0], d100[:1]])
    out["warm_up_s"] = time.time() - t
    out["compile_error"] = rep.compile_error
    out["kernels"] = {"silu": [rep.silu_kernel, rep.silu_timing_ms], "qk_norm_rope": [rep.qk_kernel, rep.qk_timing_ms]}

    def timed(prompts: list[list[int]], n: int = 15) -> dict[str, float]:
        ts = []
        for _ in range(n):
            _sync()
            t0 = time.perf_counter()
            rep.score(prompts)
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        p50 = ts[len(ts) // 2]
        return {"p50_ms": p50, "min_ms": ts[0], "max_ms": ts[-1], "tokens": sum(map(len, prompts)),
                "mfu_at_795": _flops(prompts) / (p50 / 1e3) / 795e12}

    out["d100"] = timed(d100)
    out["d300"] = timed(d300, 10)
    # Host share of a d100 step: packing alone, and launch (pack + queue kernels) before the GPU finishes.
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        rep._pack([((), [p]) for p in d100])
        ts.append((time.perf_counter() - t0) * 1e3)
    out["d100_pack_ms"] = sorted(ts)[5]
    _sync()
    t0 = time.perf_counter()
    h = rep.launch(d100)
    out["d100_launch_return_ms"] = (time.perf_counter() - t0) * 1e3
    rep.collect(h)
    for rnd in range(2):  # pipelined stream, twice (the second is reported)
        _sync()
        t0 = time.perf_counter()
        prev = None
        for s in steps:
            h = rep.launch(s)
            if prev is not None:
                rep.collect(prev)
            prev = h
        rep.collect(prev)
        dt = time.perf_counter() - t0
    out["stream16"] = {"steps": len(steps), "docs_per_s": len(flat) / dt, "s": dt,
                       "mfu_at_795": _flops(flat) / dt / 795e12}
    # Kernel-time split of one d100 step.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])) as prof:
        rep.score(d100)
        _sync()
    cats: dict[str, float] = {}
    top = []
    for e in prof.key_averages():
        if str(getattr(e, "device_type", "")) != "DeviceType.CUDA":
            continue
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        k = e.key.lower()
        cat = ("gemm" if any(s in k for s in ("gemm", "cutlass", "xmma", "nvjet", "cublas")) else
               "attention" if any(s in k for s in ("flash", "fmha", "attn")) else
               "triton (fused pointwise)" if k.startswith("triton") else
               "copy/memset" if "memcpy" in k or "memset" in k else "other")
        cats[cat] = cats.get(cat, 0.0) + us / 1e3
        top.append((round(us / 1e3, 3), e.key[:90], e.count))
    out["d100_kernel_ms"] = cats
    out["d100_top_kernels"] = sorted(top, reverse=True)[:12]
    rep = model = None  # free the 0.6B weights before the parity replicas
    # Parity on the tiny checkpoint: this variant in bf16, and in fp32 (per-prompt SDPA) for the fused maths.
    if name.endswith("(run 1)"):
        return out  # its parity is in the 2026-12-01 report
    try:
        out["parity_tiny_bf16"] = _tiny_parity(work, mode, compile_, kernel, torch.bfloat16)
        out["parity_tiny_fp32_sdpa"] = _tiny_parity(work, mode, False, kernel, torch.float32)
    except Exception as exc:  # noqa: BLE001
        out["parity_error"] = f"{type(exc).__name__}: {exc}"[:400]
    return out


def run_tf_fp32(work: Path) -> dict[str, Any]:
    """The transformers engine's padded fp32 forward on CUDA vs the reference, its suspects varied."""
    import torch
    from transformers import AutoModelForCausalLM

    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
    from tests import reference
    from tests.tiny_qwen3 import build_tiny_qwen3

    tiny = build_tiny_qwen3(work / "tiny")
    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny), None), max_length=512, max_query_tokens=64)
    docs = [f"document {i}: " + "the capital of a country is a city " * (i % 7) + str(i * 7919) for i in range(40)]
    shared = tok.encode_shared("What is the capital of the United States?", reference.DEFAULT_INSTRUCTION)
    prompts = [tok.assemble(shared, d) for d in tok.encode_documents(docs)]
    ref = reference.score_ids(str(tiny), prompts)
    out: dict[str, Any] = {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                           "float32_matmul_precision": torch.get_float32_matmul_precision()}

    def padded(model: Any, rows: list[list[int]], dev: str) -> list[float]:
        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False).logits[:, -1]
        return torch.softmax(logits[:, [tok.no_id, tok.yes_id]].float(), -1)[:, 1].tolist()

    for impl in ("sdpa", "eager"):
        for dev in dict.fromkeys((DEV, "cpu")):
            model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32, attn_implementation=impl).to(dev).eval()
            cases = {"padded batch": lambda m=model, d=dev: padded(m, prompts, d),
                     "one row at a time": lambda m=model, d=dev: [x for r in prompts for x in padded(m, [r], d)],
                     "padded, no position_ids": None}
            for case, fn in cases.items():
                if fn is None:
                    width = max(map(len, prompts))
                    ids = torch.tensor([[0] * (width - len(r)) + r for r in prompts]).to(dev)
                    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in prompts]).to(dev)
                    with torch.no_grad():
                        lg = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -1]
                    got = torch.softmax(lg[:, [tok.no_id, tok.yes_id]].float(), -1)[:, 1].tolist()
                else:
                    got = fn()
                out[f"{impl} {dev} {case}"] = max(abs(a - b) for a, b in zip(got, ref, strict=True))
            if impl == "sdpa" and dev == "cuda":  # which SDPA kernel
                for backend in ("MATH", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
                    from torch.nn.attention import SDPBackend, sdpa_kernel

                    try:
                        with sdpa_kernel(getattr(SDPBackend, backend)):
                            got = padded(model, prompts, dev)
                        out[f"sdpa cuda padded batch, backend {backend}"] = max(abs(a - b) for a, b in zip(got, ref, strict=True))
                    except Exception as exc:  # noqa: BLE001
                        out[f"sdpa cuda padded batch, backend {backend}"] = f"{type(exc).__name__}: {exc}"[:200]
            del model
    # The engine itself (family code), as the suite's parity phase runs it.
    import asyncio

    from adapters.base import ScoreJob
    from adapters.registry import build_engine
    from schemas.config import TransformersEngineConfig

    async def engine_scores() -> list[float]:
        eng = build_engine(TransformersEngineConfig(name="t", path=str(tiny), device=DEV, dtype="float32",
                                                    max_length=512, max_query_tokens=64))
        await eng.start()
        try:
            job = ScoreJob(query="What is the capital of the United States?", instruction=reference.DEFAULT_INSTRUCTION,
                           shared_ids=shared, item_ids=tok.encode_documents(docs))
            return (await eng.score(job)).scores
        finally:
            await eng.stop()

    got = asyncio.run(engine_scores())
    out["transformers engine cuda fp32"] = max(abs(a - b) for a, b in zip(got, ref, strict=True))
    return out


def run_vllm_score(work: Path, dtype: str) -> dict[str, Any]:
    """The vllm-score engine (classifier conversion, raw logit + the gateway's sigmoid) vs the reference, tiny checkpoint."""
    import asyncio

    from adapters.base import ScoreJob
    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
    from adapters.registry import build_engine
    from schemas.config import VllmScoreEngineConfig
    from tests import reference
    from tests.tiny_qwen3 import build_tiny_qwen3

    tiny = build_tiny_qwen3(work / "tiny")
    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny), None), max_length=512, max_query_tokens=64)
    docs = [f"document {i}: " + "the capital of a country is a city " * (i % 7) + str(i * 7919) for i in range(60)]
    query = "What is the capital of the United States?"
    shared = tok.encode_shared(query, reference.DEFAULT_INSTRUCTION)
    ref = reference.score_ids(str(tiny), [tok.assemble(shared, d) for d in tok.encode_documents(docs)])

    async def scores() -> list[float]:
        eng = build_engine(VllmScoreEngineConfig(name="v", path=str(tiny), dtype=dtype, max_length=512, max_query_tokens=64,
                                                 gpu_memory_utilization=0.2))
        await eng.start()
        try:
            job = ScoreJob(query=query, instruction=reference.DEFAULT_INSTRUCTION, shared_ids=shared,
                           item_ids=tok.encode_documents(docs))
            return (await eng.score(job)).scores
        finally:
            await eng.stop()

    got = asyncio.run(scores())

    def order(v: list[float]) -> list[int]:
        return sorted(range(len(v)), key=lambda i: -v[i])

    return {"dtype": dtype, "max_abs_diff": max(abs(a - b) for a, b in zip(got, ref, strict=True)),
            "same_order": order(got) == order(ref), "score_range": [min(got), max(got)], "reference_range": [min(ref), max(ref)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out/variants"))
    ap.add_argument("--work", default="/tmp/rr-variants")
    ap.add_argument("--child", default=None)
    ap.add_argument("--only", default=None, help="comma-separated variant names (default: all), plus tf-fp32")
    ap.add_argument("--child-timeout", type=float, default=150)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.child:
        if args.child == "tf-fp32":
            res = run_tf_fp32(work)
        elif args.child.startswith("vllm-score-"):
            res = run_vllm_score(work, args.child.removeprefix("vllm-score-"))
        else:
            res = run_variant(args.child, work)
        print("RESULT " + json.dumps(res, default=str), flush=True)
        return
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = float(os.environ.get("RR_DEADLINE", time.time() + 3600))
    names = args.only.split(",") if args.only else [*list(VARIANTS)[:3], "tf-fp32", "vllm-score-bfloat16", *list(VARIANTS)[3:],
                                                    "vllm-score-float32"]
    results: dict[str, Any] = {}
    for name in names:
        left = deadline - time.time() - 10
        if left < 40:
            results[name] = {"skipped": f"{left:.0f}s left"}
            continue
        limit = min(args.child_timeout, left)
        t = time.time()
        try:
            p = subprocess.run([sys.executable, "-m", "benchmarks.packed_variants", "--child", name, "--work", str(work)],
                               check=False, capture_output=True, text=True, timeout=limit)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            results[name] = json.loads(lines[-1][7:]) if lines else {"error": f"rc {p.returncode}", "stderr": p.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            results[name] = {"error": f"timed out after {limit:.0f}s (compilation stall?)"}
        results[name]["child_s"] = time.time() - t
        print(f"== {name}: {json.dumps(results[name], default=str)[:3000]}", flush=True)
        (out_dir / "variants.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n| variant | d100 ms (MFU) | d300 ms (MFU) | 16-client stream docs/s (MFU) | pack ms | tiny bf16 diff |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        if "d100" not in r:
            continue
        print(f"| {name} | {r['d100']['p50_ms']:.1f} ({r['d100']['mfu_at_795']:.1%}) | {r['d300']['p50_ms']:.1f} "
              f"({r['d300']['mfu_at_795']:.1%}) | {r['stream16']['docs_per_s']:.0f} ({r['stream16']['mfu_at_795']:.1%}) | "
              f"{r['d100_pack_ms']:.2f} | {r.get('parity_tiny_bf16', {}).get('max_abs_diff', '-')} |")


if __name__ == "__main__":
    main()
