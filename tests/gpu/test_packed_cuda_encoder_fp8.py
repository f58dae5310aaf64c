"""``precision = "fp8"`` for cross-encoders on CUDA as it serves by default (``pytest -m gpu``;
skipped without CUDA): the e4m3 GEMM on the device (``torch._scaled_mm`` or vLLM's CUTLASS, never
the CPU's emulation), compiled (or Triton / vLLM) quantizing regions, every step a replayed CUDA
graph -- against the CPU's dequantized reference (tests/test_packed_encoder_fp8.py: transformers'
own modules, one pair at a time, each linear layer "quantize the input per token in fp32, times
the dequantized weight, plus the bias"), with the engine's own quantized weights.

Tolerance: on the CPU the engine's bf16 FP8 path and this reference differ by at most 5 % of the
logits' spread (an activation on an e4m3 rounding boundary rounded the other way, carried on by
later layers). On the device FlashAttention, fast accumulation and the GEMM's own bf16 epilogue
round differently again, and these tiny random models carry every such flip to the logits: on
the H200 (2026-12-05, separate q/k/v bias add) 0.16-0.32, on the H100 (2026-12-05, bias in the
epilogue) 0.16-0.25 centred relative error. ``CENTRED_TOL`` 0.5 sits between those and what a
wiring mistake costs: a doubled weight scale measured 0.83 to 1.43 on the CPU (there against
fp32: the reference here is built from the engine's own weights). The ranking itself is judged
by the gate on a trained checkpoint, not here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from adapters.base import ScoreJob
from schemas.config import PackedEngineConfig
from tests.gpu.conftest import cuda_only
from tests.gpu.test_packed_cuda import MIXED, QUERIES

pytestmark = [pytest.mark.gpu, cuda_only("FP8 encoders on the device")]

CENTRED_TOL = 0.5


@pytest.fixture(scope="module", params=["xlmr", "bert"])
def cross_encoder(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> tuple[str, Path]:
    from tests.test_packed_encoder_fp8 import _random_biases
    from tests.tiny_encoders import build_tiny_cross_encoder

    kind = request.param  # random biases and LayerNorm weights: a bias added wrong moves the scores
    return kind, _random_biases(build_tiny_cross_encoder(tmp_path_factory.mktemp("gpu-ce-fp8") / kind, kind=kind))


def test_fp8_engine_with_graphs_scores_as_the_dequantized_reference(
    cross_encoder: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from adapters.registry import build_engine
    from adapters.runtimes.packed import fp8_gemm, gate
    from tests.test_packed_encoder_fp8 import _reference_logits

    monkeypatch.setattr(gate, "GOLDEN_QUERIES", 12)  # the gate's code path; random weights fail it: "warn"
    monkeypatch.setattr(gate, "GOLDEN_DOCS", 12)
    kind, path = cross_encoder

    async def run() -> tuple[list[list[float]], list[list[float]], list[Any], Any, dict[str, Any]]:
        eng: Any = build_engine(
            PackedEngineConfig(
                name="p",
                path=str(path),
                devices=("cuda",),
                batch_tokens=256,
                precision="fp8",
                precision_gate="warn",
            )
        )
        await eng.start()
        try:
            tok = eng.tokenizer
            jobs = [
                ScoreJob(
                    query=q,
                    instruction="",
                    shared_ids=tok.encode_shared(q, ""),
                    item_ids=tok.encode_documents(MIXED),
                    raw_scores=True,
                )
                for q in QUERIES
            ]
            first = [r.scores for r in await asyncio.gather(*(eng.score(j) for j in jobs))]
            again = [r.scores for r in await asyncio.gather(*(eng.score(j) for j in jobs))]
            rows = [tok.row(j.shared_ids, d) for j in jobs for d in j.item_ids]
            weights = [
                tuple(fp8_gemm.Fp8Weight(w.qt.cpu(), w.scale.cpu()) for w in ws) for ws in eng._replicas[0].fp8.weights
            ]
            return first, again, rows, weights, eng.stats()
        finally:
            await eng.stop()

    first, again, rows, weights, stats = asyncio.run(run())
    precision = stats["precision"]
    assert not precision["gemm"].startswith("emulated") and "compile_error" not in stats, stats
    assert set(precision["gemms"]) == {"qkv", "out", "up", "down"}, precision
    assert not any(k.startswith("emulated") for k in precision["gemms"].values()), precision
    assert all(v["kernel"] != "eager" for v in precision["quantizing_regions"].values()), precision
    assert stats["cuda_graphs"] is not None and "cuda_graph_error" not in stats, stats
    assert first == again  # replayed graphs, replayed again
    got = torch.tensor([s for scores in first for s in scores])
    want = _reference_logits(
        path, weights, kind, [r.ids for r in rows], [r.segment_start for r in rows], torch.bfloat16
    ).flatten()
    g, w = got - got.mean(), want - want.mean()
    err = ((g - w).norm() / w.norm()).item()
    print(f"{kind}: centred relative error to the dequantized reference {err:.4f}; gate {precision['gate']}")
    assert err < CENTRED_TOL, (err, got, want)


def test_triton_regions_are_picked_and_score_as_the_reference(cross_encoder: tuple[str, Path]) -> None:
    """``regions = "triton"``: encoder_fp8_triton's LayerNorm and activation kernels must be the ones
    serving (the picker would quietly fall back from a broken one), then the replica, graphs and
    all, scores as the dequantized reference."""
    from adapters.runtimes.packed import encoder_fp8, fp8_gemm
    from adapters.runtimes.packed.buckets import token_bucket
    from adapters.runtimes.packed.encoder_replicas import make_replica
    from adapters.runtimes.packed.pair_replica import load_cross_encoder
    from tests.test_packed_encoder_fp8 import _pairs, _reference_logits

    kind, path = cross_encoder
    model = load_cross_encoder(str(path), None, torch.bfloat16)
    if encoder_fp8.triton_regions(str(model.config.hidden_act)) is None:
        pytest.skip("no Triton in this install")
    rep: Any = make_replica(model, torch.device("cuda"), attention="auto", compile=True, gelu_epilogue="auto")
    rep.to_fp8(regions="triton")
    assert all(rep.fp8.kernels[r]["kernel"].startswith("triton") for r in encoder_fp8.REGIONS), rep.fp8.kernels
    prompts, segments = _pairs(kind)
    rep.warm_up([(prompts[:1], segments[:1]), (prompts, segments)])
    rep.use_graphs(token_bucket(2048), (prompts, segments))
    assert rep.graphs is not None and rep.graph_error is None, rep.graph_error
    got = torch.tensor(rep.score(prompts, segments))
    weights = [tuple(fp8_gemm.Fp8Weight(w.qt.cpu(), w.scale.cpu()) for w in ws) for ws in rep.fp8.weights]
    want = _reference_logits(path, weights, kind, prompts, segments, torch.bfloat16)
    g, w = got - got.mean(), want - want.mean()
    err = ((g - w).norm() / w.norm()).item()
    print(f"{kind} (triton regions): centred relative error to the dequantized reference {err:.4f}")
    assert err < CENTRED_TOL, (err, got, want)
