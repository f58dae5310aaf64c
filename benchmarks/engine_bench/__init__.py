"""The GPU suite's engine-level pieces: workloads, timing and the ways of scoring in one process.

Ways of scoring the same requests (``variants.py``), which ``python -m benchmarks.gpu_suite``
runs as its ``raw``, ``transformers`` and service phases:

- our engines behind the gateway's own ``RerankService`` (tokenization with cached template
  parts, dedup, truncation, engine call), everything but HTTP. Concurrent clients are
  concurrent coroutines.
- raw score: offline ``vllm.LLM.score(query_text, doc_texts)`` on the same prompts as text
  (template applied by string, as a user of the raw engine would); 16 clients = the 16 requests'
  pairs in one call, the best an offline caller can do.
- ``seed``: the seed's design: that offline ``LLM`` behind a lock, each request deduped, sorted
  by length and scored in serial batches of ``infer_batch_size`` (100), 16 callers in threads.

Workloads (``workload.py``): ``d100`` = 1 query x 100 documents of U[50,150] tokens, ``d300`` =
U[150,450], the standard instruction; each request alone (sequential) and from 16 concurrent
clients. ``measure.py`` reports docs/s, tokens/s (whole prompts: template + query + document)
and model FLOP utilization against a matmul rate measured here (bf16 8192^3 on CUDA; fp32 on CPU).

Its own command line (``python -m benchmarks.engine_bench``, later ``gpu_suite engine``) and the
CPU comparison of packed against padded transformers (``--cpu-compare``,
docs/benchmarks/cpu-2026-12-01-packed) were removed on 2026-12-04: the suite's phases run the
same variants, and the CPU comparison's answer is in its report.
"""

# The workloads, the measurement and the ways of scoring live in the modules
# below. The names are handed on here ("X as X": a re-export outside ``__all__``) because
# benchmarks.gpu_suite and benchmarks.gpu_suite.qwen3 use them as ``engine_bench.X``.
from benchmarks.engine_bench.measure import bench_variant, matmul_tflops
from benchmarks.engine_bench.measure import markdown as markdown
from benchmarks.engine_bench.variants import HF_OVERRIDES as HF_OVERRIDES
from benchmarks.engine_bench.variants import gateway_service_variant as gateway_service_variant
from benchmarks.engine_bench.variants import raw_llm as raw_llm
from benchmarks.engine_bench.variants import raw_score_fns as raw_score_fns
from benchmarks.engine_bench.variants import seed_fn as seed_fn
from benchmarks.engine_bench.variants import service_score as service_score
from benchmarks.engine_bench.workload import CLIENTS as CLIENTS
from benchmarks.engine_bench.workload import SMALL_WORKLOADS as SMALL_WORKLOADS
from benchmarks.engine_bench.workload import WARMUP as WARMUP
from benchmarks.engine_bench.workload import WORKLOADS, flops_per_prompt, make_requests
from benchmarks.engine_bench.workload import PromptLengths as PromptLengths
from benchmarks.engine_bench.workload import Request as Request
from benchmarks.engine_bench.workload import ScoreFn as ScoreFn

__all__ = ("WORKLOADS", "bench_variant", "flops_per_prompt", "make_requests", "matmul_tflops")
