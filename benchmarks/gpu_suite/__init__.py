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
   ``--twogpu-size 8b`` runs it on the 8B shape (``benchmarks.gpu_suite.qwen3.SIZES``) instead.
   ``--small`` runs the same three contestants on ``cpu`` "devices" (the phase's logic on CPU).
5. raw offline ``LLM.score`` (and the seed's design with phase ``seed``); our transformers
   engine; our vllm-generate engine in-process (phases ``transformers``, ``generate``).

Writes to $OUT: gpu_results.json, gpu_report.md, and the bench plots (log.txt comes from
device_run.sh). ``--small`` runs the same code on the tiny model on CPU (smoke test).
"""

import os

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # device_run.sh turns it off; the gateway wants it

# Set before the phases' modules import tokenizers. Each phase lives in its own module below; the
# names are handed on here so that ``benchmarks.gpu_suite.X`` keeps meaning what it did.
from benchmarks.gpu_suite.gateway_phase import DEFAULT_LEVELS, HTTP_REQUESTS, phase_gateway
from benchmarks.gpu_suite.parity import PARITY_06B, phase_parity
from benchmarks.gpu_suite.plan import (
    DEADLINE,
    GPU_ENGINES,
    REAL_CONFIG,
    SMALL_ENGINES,
    build_checkpoint,
    left,
    log,
)
from benchmarks.gpu_suite.report import TARGETS, report, two_gpu_target_lines
from benchmarks.gpu_suite.run import main, main_async
from benchmarks.gpu_suite.two_gpu import (
    LARGE_REQUESTS,
    TWO_GPU_LEVELS,
    two_gpu_contestants,
    two_gpu_ratios,
    two_gpu_row,
)

__all__ = [
    "DEADLINE",
    "DEFAULT_LEVELS",
    "GPU_ENGINES",
    "HTTP_REQUESTS",
    "LARGE_REQUESTS",
    "PARITY_06B",
    "REAL_CONFIG",
    "SMALL_ENGINES",
    "TARGETS",
    "TWO_GPU_LEVELS",
    "build_checkpoint",
    "left",
    "log",
    "main",
    "main_async",
    "phase_gateway",
    "phase_parity",
    "report",
    "two_gpu_contestants",
    "two_gpu_ratios",
    "two_gpu_row",
    "two_gpu_target_lines",
]
