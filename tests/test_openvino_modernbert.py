"""A ModernBERT cross-encoder (local attention, e.g. gte-reranker-modernbert-base) on the
openvino runtime. The cross-encoder family admits it there; a padded row longer than half the
local window past its last real token must score what it scores alone (and what
sentence-transformers gives), not NaN."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("openvino")
st = pytest.importorskip("sentence_transformers")

from adapters.base import ScoreJob
from adapters.runtimes.cpu.engine import OpenVinoEngine
from schemas.config import OpenVinoEngineConfig
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_modernbert

pytestmark = pytest.mark.anyio


async def test_modernbert_padded_rows_equal_sentence_transformers(tmp_path: Path) -> None:
    import torch

    path = build_tiny_modernbert(tmp_path / "mb")  # local window 16: short rows padded past it
    docs = [*DOCS, "short", "The capital of France is Paris. " * 6]
    engine = OpenVinoEngine(
        OpenVinoEngineConfig(
            name="m", path=str(path), cache_dir=str(tmp_path / "cache"), max_length=128, raw_scores=True
        )
    )
    await engine.start()
    try:
        tok = engine.tokenizer
        assert tok is not None
        shared = tok.encode_shared(Q, "")
        room = tok.item_room(shared)
        job = ScoreJob(
            query=Q,
            instruction="",
            shared_ids=shared,
            raw_scores=True,
            item_ids=[ids[:room] for ids in tok.encode_documents(docs)],
        )
        got = (await engine.score(job)).scores
    finally:
        await engine.stop()
    model = st.CrossEncoder(str(path), device="cpu", max_length=128)
    want = [float(s) for s in model.predict([(Q, d) for d in docs], activation_fn=torch.nn.Identity())]
    assert not any(math.isnan(s) for s in got), got
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
