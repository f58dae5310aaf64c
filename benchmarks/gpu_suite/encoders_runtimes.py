"""The runtimes ``benchmarks/gpu_suite/encoders.py`` can measure: the three the issue compares and the A/B variants.

``RUNTIMES``: label -> the model's config keys (beside name and path); ``RUNTIME_ENV``: label ->
its gateway's environment variables. ``NEEDS``: seconds a gateway needs to start and run both levels (a runtime
that would pass the deadline is skipped).
"""

from __future__ import annotations

from typing import Any

__all__ = ("COMMON", "NEEDS", "RUNTIMES", "RUNTIME_ENV")

COMMON = {"max_length": 1024, "max_query_tokens": 64}
# label -> the model's config keys beside name and path; an A/B variant is one line here.
# Removed on 2026-12-05, answered in their reports (gpu-h200-2026-12-02 to -12-03): packed-32k,
# -gil1ms, -noepilogue, -nocover, -asyncio, -parts4/3a/2, -rayon4, -again, -ownpools, -synccap.
RUNTIMES: dict[str, dict[str, Any]] = {
    "packed": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    # the packed default with the encoder layers' GEMMs in FP8 (e4m3; adapters/runtimes/packed/encoder_fp8.py);
    # "warn": the suite's checkpoint has random weights, which the ranking gate refuses (it measures noise)
    "packed-fp8": {**COMMON, "engine": "packed", "batch_tokens": 65536, "precision": "fp8", "precision_gate": "warn"},
    # the packed default without CUDA graphs: each step's ~300 kernels launched from Python
    "packed-eager": {**COMMON, "engine": "packed", "batch_tokens": 65536, "cuda_graphs": "off"},
    # the packed default with every request submitted as one job (no two-part submit when idle)
    "packed-one-job": {**COMMON, "engine": "packed", "batch_tokens": 65536, "overlap_tokenizing": "off"},
    # the packed default with the Rust tokenizer's pool at 8 threads, not one per core (RUNTIME_ENV):
    # open (gpu-h200-2026-12-03, calls 7 and 8) until an A/B beside packed repeats it
    "packed-rayon8": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    # a request's documents tokenized in 4 or 8 runs on threads against the default one call
    # (tokenize_threads; no gain on the H200 host, report gpu-h200-2026-12-05); tok4-norayon: 4 runs,
    # each encoded on its own thread alone (RUNTIME_ENV turns the tokenizer's rayon pool off)
    **{f"packed-tok{n}": {**COMMON, "engine": "packed", "batch_tokens": 65536, "tokenize_threads": n} for n in (4, 8)},
    "packed-tok4-norayon": {**COMMON, "engine": "packed", "batch_tokens": 65536, "tokenize_threads": 4},
    "vllm-score": {**COMMON, "engine": "vllm-score", "max_num_batched_tokens": 65536, "max_num_seqs": 512},
    "transformers": {**COMMON, "engine": "transformers", "device": "cuda", "dtype": "bfloat16"},
}
# runtime -> environment variables of its gateway process
RUNTIME_ENV = {"packed-rayon8": {"RAYON_NUM_THREADS": "8"}, "packed-tok4-norayon": {"TOKENIZERS_PARALLELISM": "false"}}
# runtime -> seconds its gateway needs to start and run both levels (vLLM: import + compile ~90 s)
NEEDS = {**{label: 75 for label in RUNTIMES if label.startswith("packed")}, "vllm-score": 170, "transformers": 60}
NEEDS["packed-fp8"] = 110  # + the gate's two passes over the golden set and the kernels' timing at start
