"""The GPU engines over HTTP, each gateway its own ``python -m gateway serve`` process and
``rerank-gateway bench`` the client: ``qwen3`` (Qwen3 sizes, FP8, the issue's 0.6B targets),
``encoders`` (cross-encoder runtimes), ``host`` (the host's share of an idle request, on the CPU).

The default run without a subcommand (parity against a reference, one in-process gateway per
engine kind with the targets, two GPUs) was removed on 2026-12-05 (last in commit 43eb9a5; its
findings are in gpu-h200-2026-12-01 and -12-01-b): ``qwen3 --phases 0.6b`` measures the same
levels and judges the targets.
"""

import os

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # device_run.sh turns it off; the gateway wants it
