"""What the GPU run works with: the 0.6B checkpoint's shape, each engine kind's settings, the
deadline every phase is held to, the checkpoint itself (phase 1), the workloads (d100 = 1 query x
100 documents of U[50,150] tokens, d300 = U[150,450]), and the FLOPs a prompt costs against the
matmul rate measured here (MFU).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter
from schemas.config import DEFAULT_INSTRUCTION

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
# Qwen3-Reranker-0.6B / -4B / -8B config.json (the Qwen3 bases): the shapes of ``qwen3`` and ``--twogpu-size``.
SIZES: dict[str, dict[str, Any]] = {
    "0.6b": REAL_CONFIG,
    "4b": {**REAL_CONFIG, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36}
    | {"num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "8b": {**REAL_CONFIG, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36}
    | {"num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
}
# Scheduler steps sized for the workload: a d100 request is ~17k tokens in ~100 sequences, 16
# clients send ~270k tokens at once; 64k-token steps of up to 512 sequences take them in a few.
_VLLM_GPU = {
    "max_length": 2048,
    "max_query_tokens": 256,
    "gpu_memory_utilization": 0.3,
    "max_num_batched_tokens": 65536,
    "max_num_seqs": 512,
}
GPU_ENGINES: dict[str, dict[str, Any]] = {
    "vllm-score": _VLLM_GPU,
    "vllm-generate": _VLLM_GPU,
    # 64k-token steps: a lone d100 (~18.6k tokens) or d300 (~38.5k) request is one step.
    "packed": {"max_length": 2048, "max_query_tokens": 256, "batch_tokens": 65536},
    "transformers": {"max_length": 2048, "max_query_tokens": 256, "device": "cuda", "dtype": "bfloat16"},
}
_VLLM_CPU = {"max_length": 1024, "max_query_tokens": 256, "gpu_memory_utilization": 0.05, "enforce_eager": True}
SMALL_ENGINES: dict[str, dict[str, Any]] = {
    "vllm-score": _VLLM_CPU,
    "vllm-generate": _VLLM_CPU,
    "packed": {"max_length": 1024, "max_query_tokens": 256},
    "transformers": {"max_length": 1024, "max_query_tokens": 256},
}
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
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16: an 8B model in fp32 would take 32 GB first
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg)
    torch.set_default_dtype(dtype)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


def make_requests(model_dir: str, name: str, count: int, small: bool = False, salt: int = 0) -> list[Request]:
    """Fresh requests per ``salt`` (no prefix cache carries over between uses)."""
    docs, doc_tokens = (SMALL_WORKLOADS if small else WORKLOADS)[name]
    seed = {"d100": 100, "d300": 300}[name] + 7919 * salt
    spec = WorkloadSpec(requests=count, documents=docs, doc_tokens=doc_tokens, query_tokens="10", seed=seed)
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


def tflop_per_doc(model_dir: Path, small: bool, cfg: dict[str, Any]) -> dict[str, float]:
    """Model TFLOP per document of each workload (whole prompts: template + query + document), over 8 requests."""
    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer

    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(model_dir)), max_length=8192, max_query_tokens=2048)
    out = {}
    for wl in WORKLOADS:
        lens = []
        for query, docs in make_requests(str(model_dir), wl, 8, small, salt=7):
            shared = len(tok.encode_shared(query, DEFAULT_INSTRUCTION))
            lens += [shared + len(ids) + tok.suffix_length for ids in tok.encode_documents(docs)]
        out[wl] = sum(flops_per_prompt(n, cfg) for n in lens) / len(lens) / 1e12
    return out


def matmul_tflops() -> tuple[float, str]:
    """Median dense matmul rate of this device (what MFU is measured against)."""
    import torch

    n, dtype, dev = (8192, torch.bfloat16, "cuda") if torch.cuda.is_available() else (1024, torch.float32, "cpu")
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
