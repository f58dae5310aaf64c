"""Refinement on a two-label (softmax) cross-encoder for a request asking raw scores (TEI's
``raw_scores``, vLLM's ``use_activation: false``): the scores refinement orders are then the
positive logits, not the softmax probabilities the model's config makes the default, so the
error bound must be the logits' (it was the probabilities', several times smaller, and the
top-10 came back in an order fp32 does not give)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("openvino")

from adapters.base import ScoreJob
from adapters.runtimes.cpu.engine import OpenVinoEngine
from adapters.runtimes.parity import generate_golden_set, keeps_top_k
from schemas.config import OpenVinoEngineConfig
from tests.tiny_encoders import build_tiny_cross_encoder

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("rv-refine-raw")
    return build_tiny_cross_encoder(base / "m", num_labels=2), base / "cache"


def _job(engine: OpenVinoEngine, query: str, docs: list[str]) -> ScoreJob:
    tok = engine.tokenizer
    assert tok is not None
    shared = tok.encode_shared(query, "")
    room = tok.item_room(shared)
    return ScoreJob(
        query=query,
        instruction="",
        shared_ids=shared,
        item_ids=[ids[:room] for ids in tok.encode_documents(docs)],
        raw_scores=True,
    )


async def test_raw_score_requests_keep_fp32s_top10_order_on_a_softmax_head(model):
    path, cache = model
    kw = {
        "name": "m",
        "path": str(path),
        "cache_dir": str(cache),
        "streams": 1,
        "threads": 2,
        "parity_queries": 8,
        "parity_documents": 20,
    }
    exact = OpenVinoEngine(OpenVinoEngineConfig(**kw))
    refined = OpenVinoEngine(OpenVinoEngineConfig(**kw, precision="bf16", refine_top=10, parity_min_agreement=0.01))
    await exact.start()
    await refined.start()
    try:
        if refined.describe()["inference_precision"] != "bf16":
            pytest.skip("no bf16 on this CPU: the reduced mode is exact")
        broken = []
        for k, q in enumerate(generate_golden_set(exact.tokenizer.vocab, queries=30, documents=30, seed=99)):
            want = (await exact.score(_job(exact, q.query, q.documents))).scores
            got = (await refined.score(_job(refined, q.query, q.documents))).scores
            if not keeps_top_k(want, got, tie=1e-3):
                broken.append(k)
        assert broken == [], f"raw-score requests whose top-10 order is not fp32's: {broken}"
    finally:
        await exact.stop()
        await refined.stop()
