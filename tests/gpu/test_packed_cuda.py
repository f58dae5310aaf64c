"""The packed Qwen3 engine as it serves by default on a GPU, against the independent CPU reference
(``pytest -m gpu``; skipped without CUDA).

On CPU the packed engine takes the exact per-prompt SDPA path and never compiles, so the code that
serves by default on a GPU is tested only here: varlen attention over the packed step's offsets
(``cu_seqlens``: the per-prompt SDPA reads host lengths instead, so an offsets bug passes every
CPU test), the pointwise regions compiled (``compile = "auto"``), the fused-op pickers (vLLM's
silu·mul and q/k norm + RoPE when vLLM's ops load), and the scheduler's pipelined steps (step k+1
packed into the other pinned host buffer and copied while step k runs). Small sizes: the tiny
spread checkpoint (scores over ~0.1-0.99), a few requests, in seconds after the first compile.

Tolerance: the engine runs bf16 on CUDA, the reference fp32 on the CPU. The same engine in bf16 on
the CPU differs from the reference by at most 0.016 on these documents; ``BF16_TOL`` allows 2.5x
that. A step whose offsets are off by one token moved scores by up to 0.80 (measured on CPU by
shifting the per-prompt lengths the same way).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from adapters.base import ScoreJob
from adapters.runtimes.packed.engine import PackedQwen3Engine
from schemas.config import DEFAULT_INSTRUCTION, PackedEngineConfig
from tests import reference
from tests.corpus import DOCS, Q
from tests.gpu.conftest import ON_CPU, cuda_only, replica

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.anyio,
    pytest.mark.skipif(not (torch.cuda.is_available() or ON_CPU), reason="the GPU suite needs CUDA"),
]

BF16_TOL = 0.04
QUERIES = (Q, "capital punishment", "Which fox is quick and brown, and which dog is lazy?")
# Documents of many lengths (1 to ~200 tokens): a step packs prompts of mixed length.
MIXED = [*DOCS, "x", "Click Settings. " * 12, "What?\n", "The quick brown fox jumps over the lazy dog. " * 4]


def _job(tok: Any, query: str, docs: list[str]) -> ScoreJob:
    return ScoreJob(
        query=query,
        instruction=DEFAULT_INSTRUCTION,
        shared_ids=tok.encode_shared(query, DEFAULT_INSTRUCTION),
        item_ids=tok.encode_documents(docs),
    )


def _config(path: Path, device: torch.device, **kw: Any) -> PackedEngineConfig:
    # Everything else at its default: attention, compile and the kernels "auto", prefixes shared.
    return PackedEngineConfig(
        name="p", path=str(path), devices=(str(device),), max_length=512, max_query_tokens=64, **kw
    )


@pytest.fixture(scope="module")
def want(spread_dir: Path) -> dict[str, list[float]]:
    return {q: reference.score_texts(spread_dir, q, MIXED) for q in QUERIES}


@pytest.fixture(scope="module", params=[True, False], ids=["shared-prefix", "whole-prompts"])
async def engine(device: torch.device, spread_dir: Path, request: pytest.FixtureRequest) -> Any:
    # A 300-token budget: each request spans several steps, and steps follow each other closely
    # enough for the scheduler to pack and copy the next while one runs.
    eng = PackedQwen3Engine(_config(spread_dir, device, batch_tokens=300, share_prefix=request.param))
    await eng.start()
    yield eng
    await eng.stop()


def _max_diff(got: list[float], want: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(got, want, strict=True))


async def test_the_default_cuda_engine_scores_as_the_reference(engine: Any, want: dict[str, list[float]]) -> None:
    for q in QUERIES:
        got = (await engine.score(_job(engine.tokenizer, q, MIXED))).scores
        assert _max_diff(got, want[q]) < BF16_TOL, (q, got, want[q])
    assert len({round(s, 2) for s in want[QUERIES[0]]}) > 5  # the checkpoint really separates documents
    stats = engine.stats()
    if engine._replicas[0].device.type == "cuda":
        # The defaults on CUDA: a varlen kernel (not the CPU's per-prompt SDPA), compiled regions that
        # compiled (an uncompilable graph falls back to eager and says so in compile_error).
        assert stats["attention"] != "sdpa per prompt" and "compile_error" not in stats, stats
        assert stats["compiled"] is True and engine._replicas[0].pipelined
        assert stats["prefix_sharing"]["not_shared_because"] is None  # the kernel passed the bottom-right check
    assert stats["steps"] > stats["requests"]


async def test_concurrent_requests_in_pipelined_steps_each_get_their_own_scores(
    engine: Any, want: dict[str, list[float]]
) -> None:
    """Several requests at once: steps mix their prompts, and the scheduler launches step k+1
    (packed into the other pinned buffer, copied asynchronously) before collecting step k. A
    staging buffer reused while its copy is in flight, or results handed to the wrong request,
    show as another request's scores."""
    jobs = [(q, MIXED[i:] + MIXED[:i]) for i, q in enumerate(QUERIES * 3)]
    results = await asyncio.gather(*(engine.score(_job(engine.tokenizer, q, docs)) for q, docs in jobs))
    for (q, docs), res in zip(jobs, results, strict=True):
        i = MIXED.index(docs[0])
        expected = want[q][i:] + want[q][:i]
        assert _max_diff(res.scores, expected) < BF16_TOL, (q, res.scores, expected)


@cuda_only("the replica's launch/collect overlap")
def test_a_step_launched_before_the_last_is_collected_keeps_its_inputs(spread_dir: Path, device: torch.device) -> None:
    """The scheduler's overlap, driven directly: launch two steps, then collect both. Each must
    equal the same step run alone (the first step's host buffer is not refilled by the second's
    packing before its copy to the device has finished)."""
    rep, tok = replica(spread_dir, device, compile=False)
    steps = []
    for q in QUERIES:
        shared = tok.encode_shared(q, DEFAULT_INSTRUCTION)
        steps.append([tok.assemble(shared, d) for d in tok.encode_documents(MIXED)])
    alone = [rep.score(s) for s in steps]
    for _ in range(3):
        handles = [rep.launch(s) for s in steps]  # all launched, none collected yet
        got = [rep.collect(h) for h in handles]
        # Same kernels and shapes: equal but for last-bit differences, where another step's inputs
        # would move every score.
        assert all(g == pytest.approx(a, abs=1e-3) for g, a in zip(got, alone, strict=True)), (got, alone)


@cuda_only("the compiled regions")
def test_compiled_and_eager_steps_agree(spread_dir: Path, device: torch.device) -> None:
    out = {}
    for compile_ in (True, False):
        rep, tok = replica(spread_dir, device, compile=compile_)
        shared = tok.encode_shared(Q, DEFAULT_INSTRUCTION)
        prompts = [tok.assemble(shared, d) for d in tok.encode_documents(MIXED)]
        rep.warm_up([prompts[:1], prompts])
        assert rep.compile_error is None and rep.compiled is compile_
        out[compile_] = rep.score(prompts)
    # Inductor fuses the pointwise work and rounds bf16 in other places than eager (0.016 apart on
    # the CPU): close, not equal.
    assert _max_diff(out[True], out[False]) < BF16_TOL


@cuda_only("the varlen attention kernels")
def test_the_varlen_kernel_equals_per_prompt_sdpa_on_packed_offsets(device: torch.device) -> None:
    """The kernel ``attention = "auto"`` picks on CUDA, on prompts of lengths 1..97 packed by their
    offsets, against the exact per-prompt SDPA; and its bottom-right causal alignment (shared
    prefixes) against the fp32 reference of ``varlen.bottom_right_error``."""
    import itertools

    from adapters.runtimes.packed import varlen

    name, attend = varlen.pick_attention("auto", device, dtype=torch.bfloat16)
    assert not varlen.needs_lengths(attend), name  # a varlen kernel, not the per-prompt fallback
    g = torch.Generator(device="cpu").manual_seed(0)
    lens = [1, 7, 97, 2, 33, 64]
    q = torch.randn(sum(lens), 2, 64, generator=g).to(device, torch.bfloat16)
    k, v = (torch.randn(sum(lens), 1, 64, generator=g).to(device, torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
    got = attend(q, k, v, cu, cu, max(lens), max(lens), None, None).float()
    ref = varlen.sdpa_per_prompt(q.float(), k.float(), v.float(), cu, cu, None, None, lens, lens)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-2, name
    assert varlen.bottom_right_error(attend, device, torch.bfloat16) < 1e-2, name


@cuda_only("vLLM's fused ops")
def test_the_fused_ops_and_their_pickers(spread_dir: Path, device: torch.device) -> None:
    """vLLM's silu·mul and q/k norm + RoPE (when vLLM's CUDA ops load; skipped otherwise): the
    pickers find that each computes the torch region (timed, not refused), and a forward that uses
    both -- whichever was faster -- scores as the reference."""
    from adapters.runtimes.packed import kernels

    silu, qk = kernels.vllm_silu_mul(), kernels.vllm_qk_norm_rope()
    if silu is None or qk is None:
        pytest.skip("vLLM's CUDA ops do not load here (carry the .rr bundle: docs/testing.md)")
    rep, tok = replica(spread_dir, device, compile=True)
    shared = tok.encode_shared(Q, DEFAULT_INSTRUCTION)
    prompts = [tok.assemble(shared, d) for d in tok.encode_documents(MIXED)]
    rep.warm_up([prompts[:1], prompts])
    # Timed means checked first: an op that computes something else gets no timing (or an error).
    assert {"compiled", "vllm"} <= set(rep.silu_timing_ms), rep.silu_timing_ms
    assert {"compiled", "vllm"} <= set(rep.qk_timing_ms) and rep.qk_timing_ms["rel_err"] < 1e-2, rep.qk_timing_ms
    want = reference.score_texts(spread_dir, Q, MIXED)
    assert _max_diff(rep.score(prompts), want) < BF16_TOL, (rep.silu_kernel, rep.qk_kernel)
    # Both vLLM ops in the forward, whatever the timing picked.
    rep._regions = (*rep._regions[:3], silu)
    rep._qk_vllm = qk
    assert _max_diff(rep.score(prompts), want) < BF16_TOL
