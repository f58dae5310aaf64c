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
   vllm-generate; transformers too if named), one after the other: ``create_app`` + uvicorn in
   this process, ``rerank-gateway bench`` as a separate client process, one call per level (d100
   and d300, 1 and 16 clients) so the packed engine's queue/step counters are split per level;
   MFU from the workload's model FLOPs per document over the measured matmul rate.
4. two GPUs (when the machine has them): the packed engine on ``["cuda:0"]``, as two replicas on
   ``["cuda:0", "cuda:1"]`` (data parallel), and as one model split over both (``split =
   "pipeline"``), d100 at 1 client (idle latency) and 32 clients each, with each GPU's memory;
   ``--twogpu-size 8b`` runs it on the 8B shape (``plan.SIZES``) instead.
   ``--small`` runs the same three contestants on ``cpu`` "devices" (the phase's logic on CPU).

Removed on 2026-12-05 (their answers are in gpu-h200-2026-11-30 to gpu-h200-2026-12-01-d): the
phases ``raw`` (offline ``LLM.score``), ``seed`` (the seed's design), ``transformers`` and
``generate`` in-process, and ``--service-rows`` (an engine behind ``RerankService`` without HTTP).

Writes to $OUT: gpu_results.json, gpu_report.md, and the bench plots (log.txt comes from
device_run.sh). ``--small`` runs the same code on the tiny model on CPU (smoke test).
"""

import os

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # device_run.sh turns it off; the gateway wants it
