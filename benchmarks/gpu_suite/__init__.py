"""The GPU engines over HTTP, each gateway its own ``python -m gateway serve`` process and
``rerank-gateway bench`` the client: ``qwen3`` (Qwen3 sizes, FP8, the issue's 0.6B targets),
``encoders`` (cross-encoder runtimes). The run without a subcommand went on 2026-12-05 (last in
43eb9a5; gpu-h200-2026-12-01, -12-01-b); the ``vllm-blocks`` probe went once its question was
answered (last in 0819d0d; its report: docs/benchmarks/cpu-2026-12-05-vllm-block).
"""

import os

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # device_run.sh turns it off; the gateway wants it
