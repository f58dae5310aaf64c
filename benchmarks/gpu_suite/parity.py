"""Phase 2: the packed and transformers engines against the independent reference (fp32, CPU).

The 0.6B shape's requests and reference scores are kept in ``PARITY_06B`` for the gateway phase.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_suite.plan import log, make_requests


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


# The 0.6B shape's parity requests and reference scores, kept by the parity phase so that each
# gateway phase can score them through its running engine (no second engine start).
PARITY_06B: dict[str, Any] = {}


def _worst(v: list[float], base: list[float], lens: list[int]) -> dict[str, Any]:
    i = max(range(len(v)), key=lambda j: abs(v[j] - base[j]))
    return {
        "worst_doc": {
            "index": i,
            "prompt_tokens": lens[i] if i < len(lens) else None,
            "score": v[i],
            "reference": base[i],
        }
    }


async def phase_parity(model_dir: Path, work: Path, small: bool) -> dict[str, Any]:
    """Scores of the packed engine (varlen on CUDA) and transformers against the independent reference.

    Two checkpoints: the tiny random one of the CPU tests (its scores spread over ~0.1, so the
    order is meaningful: the golden set) and the 0.6B-shaped one (random weights put every
    score near 0.5: only the numeric distance is meaningful there).
    """
    from adapters.base import ScoreJob
    from adapters.registry import build_engine
    from schemas.config import DEFAULT_INSTRUCTION, PackedEngineConfig, TransformersEngineConfig
    from tests.tiny_qwen3 import build_tiny_qwen3

    tiny = build_tiny_qwen3(work / "tiny")
    dev = "cpu" if small else "cuda"
    out: dict[str, Any] = {}
    # The 0.6B shape's reference runs on the CPU (fp32, one prompt at a time): 20 documents keep it short.
    for name, path, n_docs in (("tiny (golden order)", tiny, 100), ("0.6B shape", model_dir, 20)):
        reqs = [(q, docs[:n_docs]) for q, docs in make_requests(str(path), "d100", 2, small, salt=999)]
        common = {"name": "p", "path": str(path), "max_length": 2048, "max_query_tokens": 256}
        configs = {
            "transformers fp32": TransformersEngineConfig(**common, device=dev, dtype="float32"),
            "transformers bf16": TransformersEngineConfig(**common, device=dev, dtype="bfloat16"),
            "packed fp32 (per-prompt sdpa)": PackedEngineConfig(
                **common, dtype="float32", attention="sdpa", compile="off"
            ),
            # Compiled on the 0.6B shape only (what the gateway serves); the tiny one checks varlen eager.
            "packed bf16 (auto: varlen on CUDA)": PackedEngineConfig(
                **common, dtype="bfloat16", compile="off" if path == tiny else "auto"
            ),
        }
        # One model split in a pipeline (layers halved): over two GPUs when there are two; with one,
        # its second stage on the CPU (eager: the CUDA path of a stage and the handover still run).
        split_devs, split_compile = (
            (["cpu", "cpu"], "off")
            if small
            else ((["cuda:0", "cuda:1"], "auto") if _cuda_count() >= 2 else (["cuda:0", "cpu"], "off"))
        )
        configs[f"packed bf16 split over {'+'.join(split_devs)}"] = PackedEngineConfig(
            **common,
            dtype="bfloat16",
            devices=tuple(split_devs),
            split="pipeline",
            compile="off" if path == tiny else split_compile,
        )
        if path == tiny and not small:
            # The 2026-12-01 report's finding (transformers fp32 off by 0.44 on CUDA): the same engine
            # with SDPA's math kernel only, to tell the fused SDPA kernels from the engine's own code.
            configs["transformers fp32, SDPA math kernel only"] = configs["transformers fp32"]
        # The independent reference: full causal-LM forward per prompt, fp32, on the CPU -- in a
        # child process, so this process's CPU thread pools are never used before compiling.
        t = time.time()
        code = (
            "import json, sys; from tests import reference; reqs = json.load(sys.stdin); "
            "print(json.dumps([x for q, d in reqs for x in reference.score_texts(sys.argv[1], q, d)]))"
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, str(path), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        ref_out, _ = await proc.communicate(json.dumps(reqs).encode())
        scores: dict[str, list[float]] = {"reference (CPU fp32)": json.loads(ref_out.decode().strip().splitlines()[-1])}
        log(f"reference {name}: {time.time() - t:.0f}s")
        lens: list[int] = []
        errors: dict[str, str] = {}
        for label, c in configs.items():
            math_only = label.endswith("math kernel only")
            if math_only:
                import torch

                flags = (
                    torch.backends.cuda.flash_sdp_enabled(),
                    torch.backends.cuda.mem_efficient_sdp_enabled(),
                    torch.backends.cuda.cudnn_sdp_enabled(),
                )
                torch.backends.cuda.enable_flash_sdp(False)
                torch.backends.cuda.enable_mem_efficient_sdp(False)
                torch.backends.cuda.enable_cudnn_sdp(False)
            try:
                eng = build_engine(c)
                await eng.start()
                try:
                    tok = eng.tokenizer
                    s: list[float] = []
                    lens = []
                    for q, docs in reqs:
                        shared = tok.encode_shared(q, DEFAULT_INSTRUCTION)
                        job = ScoreJob(
                            query=q,
                            instruction=DEFAULT_INSTRUCTION,
                            shared_ids=shared,
                            item_ids=tok.encode_documents(docs),
                        )
                        lens += [len(tok.assemble(shared, i)) for i in job.item_ids]
                        s += (await eng.score(job)).scores
                    scores[label] = s
                finally:
                    await eng.stop()
            except Exception as exc:  # one engine failing must not lose the others' parity  # noqa: BLE001
                errors[label] = f"{type(exc).__name__}: {exc}"[:500]
            finally:
                if math_only:
                    torch.backends.cuda.enable_flash_sdp(flags[0])
                    torch.backends.cuda.enable_mem_efficient_sdp(flags[1])
                    torch.backends.cuda.enable_cudnn_sdp(flags[2])
        base = scores["reference (CPU fp32)"]
        if path == model_dir:
            PARITY_06B["reqs"], PARITY_06B["reference"] = reqs, base

        def order(v: list[float]) -> list[int]:
            return sorted(range(len(v)), key=lambda i: -v[i])  # noqa: B023

        out[name] = {
            label: {
                "max_abs_diff_vs_reference": max(abs(a - b) for a, b in zip(v, base, strict=True)),
                "same_order": order(v) == order(base),
                "top10_same": order(v)[:10] == order(base)[:10],
                "score_range": [min(v), max(v)],
                # the worst document: index, its prompt's length in tokens, its two scores
                **_worst(v, base, lens),
            }
            for label, v in scores.items()
        }
        out[name].update({label: {"error": e} for label, e in errors.items()})
        log(f"parity {name}: {json.dumps(out[name])}")
    return out
