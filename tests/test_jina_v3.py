"""Jina reranker v3 (listwise, remote code) against a local stand-in loaded through the real path.

The real checkpoint and its code cannot be fetched here; ``tests/tiny_jina.py`` writes a
checkpoint whose ``auto_map`` points at a local modeling file, loaded with
``trust_remote_code=True`` by the family's own loading code. The reference below recomputes
the stand-in's scores from its weights file with numpy: it shares no code with the engine.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from litestar.testing import TestClient

from adapters.base import ScoreJob
from adapters.runtimes.transformers import TransformersEngine
from gateway.app import create_app
from schemas.config import Settings, TransformersEngineConfig
from tests.loopback import wait_loaded
from tests.tiny_jina import build_tiny_jina

QUERY = "what is the capital of france"
DOCS = [
    "paris is the capital of france",
    "dogs bark at night",
    "the capital city of germany is berlin",
    "france has many cities",
    "quantum computing uses qubits",
]


@pytest.fixture(scope="module")
def jina_dir(tmp_path_factory):
    return build_tiny_jina(tmp_path_factory.mktemp("tiny-jina"))


def reference_cosines(path, query: str, docs: list[str]) -> list[float]:
    """Plain numpy: hashed words -> mean embedding -> cosine with the query's."""
    from safetensors.numpy import load_file

    weights = load_file(str(path / "model.safetensors"))["embed.weight"].astype(np.float64)
    vocab = weights.shape[0]

    def embed(text: str) -> np.ndarray:
        ids = [zlib.crc32(w.lower().encode()) % vocab for w in text.split()] or [0]
        return weights[ids].mean(axis=0)

    q = embed(query)
    out = []
    for d in docs:
        e = embed(d)
        out.append(float(q @ e / (np.linalg.norm(q) * np.linalg.norm(e))))
    return out


def _config(path, **kw) -> TransformersEngineConfig:
    base = {"name": "jina", "path": str(path), "trust_remote_code": True, "dtype": "float32", "device": "cpu"}
    return TransformersEngineConfig(**{**base, **kw})


async def _engine(path, **kw) -> TransformersEngine:
    engine = TransformersEngine(_config(path, **kw))
    await engine.start()
    return engine


@pytest.mark.anyio
async def test_auto_detects_jina_and_scores_equal_reference(jina_dir):
    engine = await _engine(jina_dir)  # family = "auto": JinaForRanking in config.json
    try:
        assert engine.tokenizer is None  # a text engine: the model tokenizes itself
        described = engine.describe()
        assert described["family"] == "jina-v3" and described["runtime"] == "transformers"
        assert described["dtype"] == "float32" and described["device"] == "cpu"
        result = await engine.score(ScoreJob(query=QUERY, instruction="", texts=DOCS))
        cosines = reference_cosines(jina_dir, QUERY, DOCS)
        assert result.scores == pytest.approx([(1 + c) / 2 for c in cosines], abs=1e-6)
        assert len({round(c, 4) for c in cosines}) == len(DOCS)  # distinct: positions are checkable
        # Words of the query once per block plus every document's words (no tokenizer files).
        assert result.input_tokens == len(QUERY.split()) + sum(len(d.split()) for d in DOCS)
        raw = await engine.score(ScoreJob(query=QUERY, instruction="", texts=DOCS, raw_scores=True))
        assert raw.scores == pytest.approx(cosines, abs=1e-6)
    finally:
        await engine.stop()


@pytest.mark.anyio
async def test_blocks_are_merged_back_to_input_positions(jina_dir):
    engine = await _engine(jina_dir, family="jina-v3", block_size=2)
    try:
        model = engine._family._model  # the stand-in records each rerank call's document count
        docs = DOCS * 2 + ["one more document"]  # 11 documents -> blocks of 2, 2, 2, 2, 2, 1
        result = await engine.score(ScoreJob(query=QUERY, instruction="", texts=docs))
        assert model.calls == [2, 2, 2, 2, 2, 1]
        expected = [(1 + c) / 2 for c in reference_cosines(jina_dir, QUERY, docs)]
        assert result.scores == pytest.approx(expected, abs=1e-6)
        assert result.input_tokens == 6 * len(QUERY.split()) + sum(len(d.split()) for d in docs)
    finally:
        await engine.stop()


@pytest.mark.anyio
async def test_without_trust_remote_code_the_load_fails_clearly(jina_dir):
    engine = TransformersEngine(_config(jina_dir, trust_remote_code=False))
    with pytest.raises(ValueError, match="set trust_remote_code = true"):
        await engine.start()
    await engine.stop()


@pytest.mark.anyio
async def test_a_checkpoint_without_rerank_fails_clearly(tiny_qwen3_dir):
    # Forcing the family onto a checkpoint whose AutoModel has no rerank(): refused at load.
    engine = TransformersEngine(_config(tiny_qwen3_dir, family="jina-v3"))
    with pytest.raises(ValueError, match=r"no rerank\(query, documents\) method"):
        await engine.start()
    await engine.stop()


def test_over_http_order_duplicates_and_ready(jina_dir):
    settings = Settings(models=(_config(jina_dir, block_size=2),))
    with TestClient(create_app(settings, configure_logs=False)) as client:
        wait_loaded(client, 60)
        ready = client.get("/ready").json()["models"][0]
        assert ready["state"] == "ready", ready
        assert (ready["family"], ready["runtime"], ready["device"], ready["dtype"]) == (
            "jina-v3",
            "transformers",
            "cpu",
            "float32",
        )
        docs = [DOCS[3], DOCS[0], DOCS[1], DOCS[0], DOCS[4]]  # a duplicate, scored once
        resp = client.post("/v2/rerank", json={"model": "jina", "query": QUERY, "documents": docs})
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        expected = [(1 + c) / 2 for c in reference_cosines(jina_dir, QUERY, docs)]
        want = sorted(range(len(docs)), key=lambda i: (-round(expected[i], 9), i))
        assert [r["index"] for r in results] == want
        for r in results:
            assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-6)
        # Bad input is still a clean 4xx on a text engine.
        bad = client.post("/v2/rerank", json={"model": "jina", "query": " ", "documents": docs})
        assert bad.status_code == 422 and bad.json()["message"]
