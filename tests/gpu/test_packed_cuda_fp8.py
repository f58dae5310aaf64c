"""FP8 on CUDA as it serves (``pytest -m gpu``; skipped without CUDA): the e4m3 GEMM on the device
(torch's ``_scaled_mm`` or vLLM's CUTLASS, never the CPU's emulation) and the quantizing regions
(RMSNorm / silu·mul / plain quantization ending in per-token e4m3 scales) in Triton and in vLLM,
each against the bf16 replica and the CPU reference.

The pickers check every candidate against the torch functions at start and serve a correct one:
a Triton or vLLM kernel with wrong scales would not be served -- the engine would fall back to the
compiled regions and keep scoring right. So these tests ask for each family (``regions =
"triton"`` / ``"vLLM"``) and require that it was the one picked, then that the scores hold: a
broken kernel fails here rather than going quietly unused.

Tolerance: FP8 moved the tiny spread checkpoint's scores by at most 0.076 from bf16 on these
documents (the CPU's emulated GEMM, same quantization); ``FP8_TOL`` allows 2x.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from schemas.config import DEFAULT_INSTRUCTION
from tests import reference
from tests.gpu.conftest import cuda_only, replica
from tests.gpu.test_packed_cuda import BF16_TOL, MIXED, QUERIES

pytestmark = [pytest.mark.gpu, cuda_only("FP8 on the device")]

FP8_TOL = 0.15
REGIONS = ("norm", "silu_mul", "quant")


def _replica(path: Path, device: torch.device) -> tuple[Any, Any]:
    return replica(path, device, compile=True)


def _prompts(tok: Any, query: str) -> list[list[int]]:
    shared = tok.encode_shared(query, DEFAULT_INSTRUCTION)
    return [tok.assemble(shared, d) for d in tok.encode_documents(MIXED)]


@pytest.fixture(scope="module")
def bf16(spread_dir: Path) -> dict[str, list[float]]:
    rep, tok = _replica(spread_dir, torch.device("cuda"))
    prompts = {q: _prompts(tok, q) for q in QUERIES}
    rep.warm_up([prompts[QUERIES[0]][:1], prompts[QUERIES[0]]])
    return {q: rep.score(p) for q, p in prompts.items()}


@pytest.mark.parametrize("family", ["triton", "vLLM"])
def test_each_quantizing_kernel_family_is_picked_and_scores_as_bf16(
    spread_dir: Path, bf16: dict[str, list[float]], family: str
) -> None:
    from adapters.runtimes.packed import fp8

    if family == "vLLM" and not fp8.vllm_regions():
        pytest.skip("vLLM's CUDA ops do not load here (carry the .rr bundle: docs/testing.md)")
    if family == "triton" and fp8.triton_regions() is None:
        pytest.fail("Triton is part of torch's CUDA build: its FP8 regions must load")
    rep, tok = _replica(spread_dir, torch.device("cuda"))
    rep.to_fp8(regions=family)
    prompts = {q: _prompts(tok, q) for q in QUERIES}
    rep.warm_up([prompts[QUERIES[0]][:1], prompts[QUERIES[0]]])
    picked = {r: rep.fp8_kernels[r] for r in REGIONS}
    for region, info in picked.items():
        if family == "vLLM" and not any(n.startswith("vLLM") for n in info["candidates"]):
            continue  # this vLLM build has no kernel for the region
        # A kernel of the family was correct (fp8.region_error: no farther from the exact values than the torch functions) and served.
        assert info["kernel"].startswith(family) and "note" not in info, (region, info)
    assert rep.mm_kernel in ("torch._scaled_mm", "vLLM cutlass_scaled_mm"), (rep.mm_kernel, rep.mm_timing)
    for q, p in prompts.items():
        got = rep.score(p)
        assert got != bf16[q]  # the GEMMs really ran in FP8
        assert max(abs(a - b) for a, b in zip(got, bf16[q], strict=True)) < FP8_TOL, (family, q, got, bf16[q])
        want = reference.score_texts(spread_dir, q, MIXED)
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < FP8_TOL + BF16_TOL


def test_the_default_fp8_engine_serves_the_fastest_correct_kernels(
    spread_dir: Path, bf16: dict[str, list[float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``precision = "fp8"`` end to end on CUDA (the gate on a small golden set; ``warn`` so that
    random weights' verdict does not stop the start): the kernels ``auto`` picked, and scores."""
    import asyncio

    from adapters.base import ScoreJob
    from adapters.runtimes.packed import gate
    from adapters.runtimes.packed.engine import PackedQwen3Engine
    from schemas.config import PackedEngineConfig

    monkeypatch.setattr(gate, "GOLDEN_QUERIES", 12)
    monkeypatch.setattr(gate, "GOLDEN_DOCS", 12)

    async def run() -> tuple[list[list[float]], dict[str, Any]]:
        eng = PackedQwen3Engine(
            PackedEngineConfig(
                name="p",
                path=str(spread_dir),
                devices=("cuda",),
                max_length=512,
                max_query_tokens=64,
                precision="fp8",
                precision_gate="warn",
            )
        )
        await eng.start()
        try:
            tok: Any = eng.tokenizer
            out = []
            for q in QUERIES:
                job = ScoreJob(
                    query=q,
                    instruction=DEFAULT_INSTRUCTION,
                    shared_ids=tok.encode_shared(q, DEFAULT_INSTRUCTION),
                    item_ids=tok.encode_documents(MIXED),
                )
                out.append((await eng.score(job)).scores)
            return out, eng.stats()
        finally:
            await eng.stop()

    scores, stats = asyncio.run(run())
    precision = stats["precision"]
    assert not precision["gemm"].startswith("emulated") and "compile_error" not in stats, stats
    assert {r: v["kernel"] for r, v in precision["quantizing_regions"].items()}.keys() == set(REGIONS)
    assert all(v["kernel"] != "eager" for v in precision["quantizing_regions"].values())
    # The gate's own golden set moved by 0.12 at most on the CPU (emulated GEMM): in FP8, not broken.
    assert precision["gate"]["queries"] == 12 and 0 < precision["gate"]["max_abs_diff"] < 2 * FP8_TOL
    for q, got in zip(QUERIES, scores, strict=True):
        assert max(abs(a - b) for a, b in zip(got, bf16[q], strict=True)) < FP8_TOL, (q, got, bf16[q])
