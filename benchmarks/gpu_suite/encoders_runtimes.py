"""The runtimes ``benchmarks/gpu_suite/encoders.py`` can measure: the three the issue compares and the A/B variants.

``RUNTIMES``: label -> the model's config keys (beside name and path). ``RUNTIME_SITE``: label ->
code run at that gateway's interpreter start (a ``sitecustomize.py``), for experiments that are
not product settings. ``NEEDS``: seconds a gateway needs to start and run both levels (a runtime
that would pass the deadline is skipped). ``MODELS``: the checkpoint shapes of ``--model``.
"""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_suite.encoder_checkpoint import REAL_CONFIG, TINY_CONFIG
from benchmarks.gpu_suite.encoder_shapes import MODERNBERT_CONFIG, MODERNBERT_TINY

__all__ = ("COMMON", "MODELS", "NEEDS", "RUNTIMES", "RUNTIME_SITE")

COMMON = {"max_length": 1024, "max_query_tokens": 64}
RUNTIMES: dict[str, dict[str, Any]] = {
    "packed": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    # the packed default with the encoder layers' GEMMs in FP8 (e4m3; adapters/runtimes/packed/encoder_fp8.py);
    # "warn": the suite's checkpoint has random weights, which the ranking gate refuses (it measures noise)
    "packed-fp8": {**COMMON, "engine": "packed", "batch_tokens": 65536, "precision": "fp8", "precision_gate": "warn"},
    # experiments on the host side at 16 clients: half the step budget; a 1 ms GIL switch interval
    # (RUNTIME_ENV) so the launching worker waits less for the event loop's thread
    "packed-32k": {**COMMON, "engine": "packed", "batch_tokens": 32768},
    "packed-gil1ms": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    # the packed default without CUDA graphs: each step's ~300 kernels launched from Python
    "packed-eager": {**COMMON, "engine": "packed", "batch_tokens": 65536, "cuda_graphs": "off"},
    # the packed default with the MLP's GELU on its own (not in the up-projection GEMM's epilogue)
    "packed-noepilogue": {**COMMON, "engine": "packed", "batch_tokens": 65536, "gelu_epilogue": "off"},
    # the packed default without the idle steps' covering graphs and headroom captures (RUNTIME_SITE)
    "packed-nocover": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    # the packed default with every request submitted as one job (no two-part submit when idle)
    "packed-one-job": {**COMMON, "engine": "packed", "batch_tokens": 65536, "overlap_tokenizing": "off"},
    # the packed default on asyncio's own event loop (RUNTIME_SITE hides uvloop, so uvicorn's "auto" falls back)
    "packed-asyncio": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    # the packed default with an idle request in other parts than gateway.serving.parts' (RUNTIME_SITE sets them)
    **{f"packed-parts{k}": {**COMMON, "engine": "packed", "batch_tokens": 65536} for k in ("4", "3a", "2")},
    # the packed default with the Rust tokenizer's thread pool (rayon) at 8 or 4 threads, not one per
    # core (RUNTIME_SITE): do 16 spinning tokenizer threads push the launching thread off its core?
    **{f"packed-rayon{n}": {**COMMON, "engine": "packed", "batch_tokens": 65536} for n in (8, 4)},
    # the packed default once more, in a gateway of its own: how much of a row is the run, not the code
    "packed-again": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    # the packed default with each graph's capture changed by RUNTIME_SITE (the non-finite hunt)
    "packed-ownpools": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    "packed-synccap": {**COMMON, "engine": "packed", "batch_tokens": 65536},
    "vllm-score": {**COMMON, "engine": "vllm-score", "max_num_batched_tokens": 65536, "max_num_seqs": 512},
    "transformers": {**COMMON, "engine": "transformers", "device": "cuda", "dtype": "bfloat16"},
}
# runtime -> code run at the gateway's interpreter start (an experiment, not a product setting)
RUNTIME_SITE = {
    "packed-gil1ms": "import sys\nsys.setswitchinterval(0.001)\n",
    "packed-asyncio": "import sys\nsys.modules['uvloop'] = None\n",
}
_PARTS_SITE = (
    "import os, sys\nsys.path.insert(0, os.getcwd())\n"  # the gateway runs from the checkout's root
    "import gateway.serving.parts as parts\nparts._OVERLAP_PARTS = {}\n"
)
RUNTIME_SITE.update(
    {
        f"packed-parts{k}": _PARTS_SITE.format(v)
        for k, v in (  # the defaults before 2026-12-02 (c) and (d); two
            ("4", (0.1, 0.3, 0.6, 1.0)),
            ("3a", (0.1, 0.4, 1.0)),
            ("2", (0.15, 1.0)),
        )
    }
)
RUNTIME_SITE.update({f"packed-rayon{n}": f"import os\nos.environ['RAYON_NUM_THREADS'] = '{n}'\n" for n in (8, 4)})
RUNTIME_SITE["packed-nocover"] = (
    "import os, sys\nsys.path.insert(0, os.getcwd())\n"
    "import adapters.runtimes.packed.graphs as graphs\ngraphs.COVER, graphs.HEADROOM = 0, 0\n"
)
# Hunting the rare non-finite steps under load (report gpu-h200-2026-12-03): each graph its own
# memory pool (no graph's intermediates share memory with another's); the device synchronized
# before each capture (no capture while a step computes)
_WRAP_CAPTURE = (
    "import os, sys\nsys.path.insert(0, os.getcwd())\nimport torch\n"
    "import adapters.runtimes.packed.graphs as graphs\n_capture = graphs.StepGraphs._capture\n"
    "def capture(self, key):\n    {}\n    return _capture(self, key)\n"
    "graphs.StepGraphs._capture = capture\n"
)
RUNTIME_SITE["packed-ownpools"] = _WRAP_CAPTURE.format("self._pool = torch.cuda.graph_pool_handle()")
RUNTIME_SITE["packed-synccap"] = _WRAP_CAPTURE.format("torch.cuda.synchronize(self.device)")
# runtime -> seconds its gateway needs to start and run both levels (vLLM: import + compile ~90 s)
NEEDS = {**{label: 75 for label in RUNTIMES if label.startswith("packed")}, "vllm-score": 170, "transformers": 60}
NEEDS["packed-fp8"] = 110  # + the gate's two passes over the golden set and the kernels' timing at start
# --model: (real config, --tiny config, checkpoint folder name, report title)
MODELS: dict[str, tuple[dict[str, Any], dict[str, Any], str, str]] = {
    "xlmr-large": (REAL_CONFIG, TINY_CONFIG, "xlmr", "bge-reranker-v2-m3 shape (XLM-R large)"),
    "modernbert-base": (MODERNBERT_CONFIG, MODERNBERT_TINY, "modernbert", "ModernBERT-base shape"),
}
