"""``--cpu-compare``: the packed engine beside the padded transformers engine on CPU, on the tiny
model and a 0.6B-shaped one, requests alternating between the engines; cpu_compare.json / .md.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.engine_bench.variants import gateway_service_variant
from gateway.bench.report import percentile
from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter

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
    lines = [("| model | documents x tokens | variant | p50 ms (sequential) | mean ms | docs/s | "
             f"{clients} clients docs/s | packed / padded time | max score diff |"), "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pair = [x for x in rows if x["model"] == r["model"] and x["documents"] == r["documents"] and x["doc_tokens"] == r["doc_tokens"]]
        padded = next(x for x in pair if x["variant"].startswith("transformers"))
        c = r[f"{clients}_clients_docs_per_s"]
        lines.append(f"| {r['model']} | {r['documents']} x {r['doc_tokens']} | {r['variant']} | {r['p50_ms']:.1f} | {r['mean_ms']:.1f} | "
                     f"{r['docs_per_s']:,.1f} | {'–' if c is None else f'{c:,.1f}'} | {r['mean_ms'] / padded['mean_ms']:.2f} | "
                     f"{r['max_abs_score_diff']:.1e} |")
    (out / "cpu_compare.md").write_text("\n".join(lines) + "\n")
    return rows
