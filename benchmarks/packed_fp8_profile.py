"""Where a packed d100 step's time goes, bf16 against each FP8 kernel family (device-call script, < 3 min).

``python -m benchmarks.packed_fp8_profile`` builds Qwen3-Reranker-0.6B's shape with random bf16
weights on the GPU (in memory), one ``PackedQwen3Replica`` as the engine runs it (fused, compiled
regions, varlen attention), and times one d100 step (100 prompts of ~186 tokens, ~18.6k tokens;
host packing and the score read included, as the engine does per step) in:

- ``bf16``: the engine's bf16 path;
- ``fp8 compiled``: FP8 GEMMs, the quantizing regions compiled by Inductor (the first FP8 version);
- ``fp8 triton``: the one-pass Triton kernels of ``fp8_triton.py``;
- ``fp8 vLLM``: vLLM's fused per-token quant ops (those the build has; a region without one says so);
- ``fp8 auto``: what the engine picks at start (per region, the fastest correct kernel);
- ``fp8 auto + vLLM GEMM``: the same with vLLM's CUTLASS GEMM instead of ``torch._scaled_mm``, if it loads.

The weights are quantized once; the variants only swap kernels. Per variant: wall p50/min/max of
15 steps, the GPU time of one step (CUDA events), the top kernels of one step (torch.profiler),
kernel time by category, the scores' largest difference from bf16's, and the kernels picked with
every candidate's error and time. Writes ``$OUT/fp8_profile.json`` (after every variant) and
``$OUT/fp8_profile.md``. ``--size 4b`` / ``8b`` profiles those shapes instead (FP8 paid off
there already: 4B -21 %, 8B -30 % idle latency). ``--device cpu`` runs the same logic on the tiny
test checkpoint (tests/tiny_qwen3.py) in seconds: what the CPU test does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_suite import REAL_CONFIG

TOP = 15


def _batch(n_docs: int, vocab: int, seed: int, lo: int = 50, hi: int = 150, prefix: int = 86) -> list[list[int]]:
    """d100's prompts: a shared prefix (system + instruction + query), a document, the fixed suffix."""
    rnd = random.Random(seed)
    top = min(vocab, 2000)
    shared = [rnd.randrange(10, top) for _ in range(prefix - 10)]
    suffix = [rnd.randrange(10, top) for _ in range(10)]
    return [shared + [rnd.randrange(10, top) for _ in range(rnd.randint(lo, hi))] + suffix for _ in range(n_docs)]


def _category(name: str) -> str:
    k = name.lower()
    if any(s in k for s in ("quant", "_norm_q", "_silu_mul_q", "rms_norm")):  # before gemm: vLLM's names hold "fp8"
        return "norm/quant (fused)"
    if any(s in k for s in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "_mm", "matmul", "addmm", "aten::mm", "f8f8bf16")):
        return "gemm"
    if any(s in k for s in ("flash", "fmha", "attn", "attention")):
        return "attention"
    if k.startswith("triton"):
        return "triton (Inductor pointwise)"
    if "silu" in k or "rope" in k:
        return "vLLM pointwise"
    if "memcpy" in k or "memset" in k or "copy" in k:
        return "copy/memset"
    return "other"


def _profile(rep: Any, prompts: list[list[int]], cuda: bool) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        rep.score(prompts)
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        on_device = str(getattr(e, "device_type", "")) == "DeviceType.CUDA"
        if cuda != on_device:
            continue
        us = (getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)) if cuda else e.self_cpu_time_total
        if us > 0:
            rows.append((us / 1e3, e.key, e.count))
    total = sum(r[0] for r in rows) or 1.0
    cats: dict[str, float] = {}
    for ms, key, _ in rows:
        cats[_category(key)] = cats.get(_category(key), 0.0) + ms
    rows.sort(reverse=True)
    return {"total_ms": round(total, 3), "by_category_ms": {k: round(v, 3) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
            "top": [{"ms": round(ms, 3), "share": round(ms / total, 4), "calls": n, "kernel": key[:120]} for ms, key, n in rows[:TOP]]}


def _time(rep: Any, prompts: list[list[int]], cuda: bool, n: int) -> dict[str, float]:
    import torch

    wall, gpu = [], []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        rep.score(prompts)
        wall.append((time.perf_counter() - t0) * 1e3)
        if cuda:
            end.record()
            end.synchronize()
            gpu.append(start.elapsed_time(end))
    wall.sort()
    gpu.sort()
    out = {"wall_p50_ms": round(wall[n // 2], 3), "wall_min_ms": round(wall[0], 3), "wall_max_ms": round(wall[-1], 3)}
    if gpu:
        out["gpu_p50_ms"] = round(gpu[n // 2], 3)
    return out


def _replica(device: str, work: Path, size: str = "0.6b") -> tuple[Any, int]:
    import torch

    from adapters.runtimes.packed.forward import PackedQwen3Replica, load_backbone

    if device == "cpu":
        from tests.tiny_qwen3 import build_tiny_qwen3

        tiny = build_tiny_qwen3(work / "tiny")
        backbone, head = load_backbone(str(tiny), None, torch.bfloat16, (1, 2))
        return PackedQwen3Replica(backbone, head, torch.device("cpu"), attention="sdpa", compile=False), backbone.embed_tokens.weight.shape[0]
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from benchmarks.gpu_qwen3 import SIZES

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(Qwen3Config(**SIZES[size])).to(torch.bfloat16).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    head = model.lm_head.weight[[1, 2]].float().clone()
    rep = PackedQwen3Replica(model.model, head, torch.device("cuda"), attention="varlen", compile=True)
    return rep, REAL_CONFIG["vocab_size"]


def _picks(rep: Any) -> dict[str, Any]:
    return {"gemm": rep.mm_kernel, "gemm_timing": rep.mm_timing, "regions": rep.fp8_kernels,
            "silu": rep.silu_kernel, "qk_norm_rope": rep.qk_kernel}


def run(device: str, out_dir: Path, work: Path, budget_s: float, docs: int, reps: int, size: str = "0.6b") -> dict[str, Any]:
    import torch

    from adapters.runtimes.packed import fp8

    t_start = time.time()
    cuda = device == "cuda"
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                           "shape": f"Qwen3-Reranker-{size.upper()} (random bf16)" if cuda else "tiny test Qwen3 (tests/tiny_qwen3.py)",
                           "variants": {}}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None
    rep, vocab = _replica(device, work, size)
    prompts = _batch(docs, vocab, seed=1)
    res["step_tokens"], res["step_prompts"] = sum(map(len, prompts)), len(prompts)
    res["attention"] = rep.attention_name

    def save() -> None:
        (out_dir / "fp8_profile.json").write_text(json.dumps(res, indent=1, default=str))

    def measure(name: str, picks: dict[str, Any] | None = None) -> None:
        t = time.time()
        rep.warm_up([prompts[:1], prompts, prompts[:1]])
        scores = rep.score(prompts)
        row: dict[str, Any] = {"warm_up_s": round(time.time() - t, 1), **_time(rep, prompts, cuda, reps),
                               "profile": _profile(rep, prompts, cuda), "compile_error": rep.compile_error}
        if name == "bf16":
            res["bf16_scores"] = scores
        else:
            row["max_abs_diff_vs_bf16"] = max(abs(a - b) for a, b in zip(scores, res["bf16_scores"], strict=True))
            # the kernel families compute one function: they differ only by e4m3 rounding-boundary flips
            first = res.setdefault("first_fp8_scores", scores)
            row["max_abs_diff_vs_first_fp8"] = max(abs(a - b) for a, b in zip(scores, first, strict=True))
            row["picks"] = picks or _picks(rep)
        res["variants"][name] = row
        save()
        print(f"[fp8-profile] {name}: {json.dumps({k: v for k, v in row.items() if k not in ('profile', 'picks')})}", flush=True)

    measure("bf16")
    variants = [("fp8 compiled", "compiled"), ("fp8 triton", "triton"), ("fp8 vLLM", "vLLM"), ("fp8 auto", "auto")]
    first = True
    for name, choice in variants:
        if time.time() - t_start > budget_s:
            res["variants"][name] = {"skipped": f"budget of {budget_s:.0f} s spent"}
            continue
        try:
            if first:
                rep.to_fp8(regions=choice)
                first = False
            else:
                rep.pick_fp8_regions(choice)
            measure(name)
        except Exception as exc:  # noqa: BLE001  # one variant failing must not lose the others
            res["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            save()
    vllm_mm = fp8.mm_vllm() if cuda else None
    if vllm_mm is not None and not first and time.time() - t_start <= budget_s:
        try:
            rep.pick_fp8_regions("auto")
            saved, rep._mm = (rep.mm_kernel, rep._mm), vllm_mm
            rep.mm_kernel = "vLLM cutlass_scaled_mm"
            measure("fp8 auto + vLLM GEMM")
            rep.mm_kernel, rep._mm = saved
        except Exception as exc:  # noqa: BLE001
            res["variants"]["fp8 auto + vLLM GEMM"] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    res.pop("bf16_scores", None)
    res.pop("first_fp8_scores", None)
    res["total_s"] = round(time.time() - t_start, 1)
    save()
    (out_dir / "fp8_profile.md").write_text(markdown(res))
    return res


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Packed d100 step: bf16 vs FP8 kernel families ({res['device']})", "",
             f"{res['shape']}; one step of {res['step_prompts']} prompts, {res['step_tokens']} tokens; "
             f"attention {res['attention']}; torch {res['torch']}, triton {res['triton']}; {res.get('total_s', '?')} s in all.", "",
             "| variant | wall p50 / min / max ms | GPU ms | kernel ms: gemm / attention / norm-quant / Inductor / other "
             "| max abs Δscore vs bf16 / vs first fp8 | regions: norm / silu·mul / attn-out quant |",
             "|---|---|---|---|---|---|"]
    for name, r in res["variants"].items():
        if "wall_p50_ms" not in r:
            lines.append(f"| {name} | {r.get('error') or r.get('skipped')} | | | | |")
            continue
        c = r["profile"]["by_category_ms"]
        cats = " / ".join(f"{c.get(k, 0.0):.2f}" for k in ("gemm", "attention", "norm/quant (fused)", "triton (Inductor pointwise)"))
        other = sum(v for k, v in c.items() if k not in ("gemm", "attention", "norm/quant (fused)", "triton (Inductor pointwise)"))
        regions = r.get("picks", {}).get("regions", {})
        picked = " / ".join(regions[k]["kernel"] for k in ("norm", "silu_mul", "quant")) if regions else "–"
        diff = r.get("max_abs_diff_vs_bf16")
        diffs = "–" if diff is None else f"{diff:.4f} / {r['max_abs_diff_vs_first_fp8']:.4f}"
        lines.append(f"| {name} | {r['wall_p50_ms']:.2f} / {r['wall_min_ms']:.2f} / {r['wall_max_ms']:.2f} | {r.get('gpu_p50_ms', '–')} | "
                     f"{cats} / {other:.2f} | {diffs} | {picked} |")
    for name, r in res["variants"].items():
        if "profile" not in r:
            continue
        lines += ["", f"## {name}: top kernels of one step ({r['profile']['total_ms']:.2f} ms)", "", "| ms | share | calls | kernel |", "|---|---|---|---|"]
        lines += [f"| {k['ms']:.3f} | {k['share']:.1%} | {k['calls']} | `{k['kernel'][:100]}` |" for k in r["profile"]["top"]]
        regions = r.get("picks", {}).get("regions", {})
        if regions:
            lines += ["", "Candidates per region (rel. error vs the torch reference; ms on a 16k-token step):", ""]
            for region, info in regions.items():
                cands = "; ".join(f"{n}: " + (v["error"][:60] if "error" in v else
                                              f"err {v['rel_err']:.1e}" + (f", {v['ms']:.3f} ms" if "ms" in v else ""))
                                  for n, v in info["candidates"].items())
                lines.append(f"- {region}: **{info['kernel']}** ({cands})" + (f" – {info['note']}" if "note" in info else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out/fp8-profile"))
    ap.add_argument("--work", default="/tmp/rr-fp8-profile")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--size", choices=("0.6b", "4b", "8b"), default="0.6b", help="Qwen3-Reranker shape on CUDA (random weights)")
    ap.add_argument("--docs", type=int, default=None, help="documents in the step (default 100; 6 on cpu)")
    ap.add_argument("--reps", type=int, default=None, help="timed steps per variant (default 15; 3 on cpu)")
    ap.add_argument("--budget-s", type=float, default=130, help="start no new variant after this many seconds")
    a = ap.parse_args(argv)
    cpu = a.device == "cpu"
    budget = a.budget_s
    if os.environ.get("RR_DEADLINE"):  # .gpu/device_run.sh's: leave ~45 s for the last variant and the write-up
        budget = min(budget, float(os.environ["RR_DEADLINE"]) - time.time() - 45)
    res = run(a.device, Path(a.out), Path(a.work), budget, a.docs or (6 if cpu else 100), a.reps or (3 if cpu else 15), a.size)
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()
