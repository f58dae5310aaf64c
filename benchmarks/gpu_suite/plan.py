"""What the GPU run works with: the 0.6B checkpoint's shape, each engine kind's settings, the
deadline every phase is held to, and the checkpoint itself (phase 1).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

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
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out
