"""Cross-encoders on the packed engine as they serve by default on a GPU (``pytest -m gpu``;
skipped without CUDA): bidirectional varlen attention, the MLP's bias + GELU in the GEMM's epilogue
(bf16 on CUDA), compiled regions, and every step replayed as a captured CUDA graph (steps padded
to a bucket, the replay checked against the eager forward at start) -- against the independent
CPU reference (transformers' own model, fp32, one pair at a time).

The CPU tests exercise the graphs only with a faked ``torch.cuda``; here they are captured and
replayed on the device: the scores of replayed steps, replayed again, stay the reference's.

Tolerance: the same engine in bf16 (epilogue on) on the CPU differs from the reference by at most
0.007 on these documents; ``ENC_TOL`` allows about 3x.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import pytest

from adapters.base import ScoreJob
from schemas.config import PackedEngineConfig
from tests import reference_encoders as ref
from tests.gpu.conftest import cuda_only
from tests.gpu.test_packed_cuda import MIXED, QUERIES

pytestmark = [pytest.mark.gpu, cuda_only("CUDA graphs")]

ENC_TOL = 0.02


@pytest.fixture(scope="module", params=["xlmr", "bert"])
def cross_encoder(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    from tests.tiny_encoders import build_tiny_cross_encoder

    return build_tiny_cross_encoder(tmp_path_factory.mktemp("gpu-ce") / request.param, kind=request.param)


def _job(tok: Any, query: str, docs: list[str]) -> ScoreJob:
    return ScoreJob(
        query=query, instruction="", shared_ids=tok.encode_shared(query, ""), item_ids=tok.encode_documents(docs)
    )


def test_replayed_steps_score_as_the_reference(cross_encoder: Path) -> None:
    from adapters.registry import build_engine

    async def run() -> tuple[list[list[float]], list[list[float]], dict[str, Any]]:
        # Defaults but for a small step budget: requests span several steps, several buckets.
        eng: Any = build_engine(
            PackedEngineConfig(name="p", path=str(cross_encoder), devices=("cuda",), batch_tokens=256)
        )
        await eng.start()
        try:
            tok = eng.tokenizer
            jobs = [_job(tok, q, MIXED) for q in QUERIES]
            first = [r.scores for r in await asyncio.gather(*(eng.score(j) for j in jobs))]
            again = [
                r.scores for r in await asyncio.gather(*(eng.score(j) for j in jobs))
            ]  # replays of captured graphs
            return first, again, eng.stats()
        finally:
            await eng.stop()

    first, again, stats = asyncio.run(run())
    graphs = stats["cuda_graphs"]
    assert stats["compiled"] is True and "compile_error" not in stats, stats
    assert graphs["replays"] > 0 and not graphs["failed_captures"] and graphs["nonfinite_steps"] == 0, graphs
    assert not stats["attention"].startswith("sdpa"), stats["attention"]
    for q, a, b in zip(QUERIES, first, again, strict=True):
        want = ref.cross_scores(cross_encoder, q, MIXED)
        assert max(abs(x - y) for x, y in zip(a, want, strict=True)) < ENC_TOL, (q, a, want)
        assert b == pytest.approx(a, abs=1e-3)  # a replay gives the same scores again
    assert max(want) - min(want) > 0.05  # the tiny model really separates documents


def test_graphs_off_and_on_agree(cross_encoder: Path) -> None:
    """The same steps with ``cuda_graphs = "off"`` (eager launches): the graph replays compute them."""
    from adapters.registry import build_engine

    async def scores(graphs: Literal["auto", "off"]) -> list[float]:
        eng: Any = build_engine(
            PackedEngineConfig(
                name="p", path=str(cross_encoder), devices=("cuda",), batch_tokens=256, cuda_graphs=graphs
            )
        )
        await eng.start()
        try:
            return list((await eng.score(_job(eng.tokenizer, QUERIES[0], MIXED))).scores)
        finally:
            await eng.stop()

    assert asyncio.run(scores("auto")) == pytest.approx(asyncio.run(scores("off")), abs=ENC_TOL / 4)
