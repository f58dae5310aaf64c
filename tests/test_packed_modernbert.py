"""Engine ``packed`` on ModernBERT cross-encoders (CPU: the exact per-pair SDPA, banded on local
layers), against sentence-transformers' ``CrossEncoder.predict`` and plain transformers run padded
(eager attention, one batch): independent implementations of the same model.

The tiny checkpoints (``tests.tiny_encoders.build_tiny_modernbert``) have 4 layers, global
attention in layers 0 and 3 (RoPE theta 160k) and local attention (±8 tokens, theta 10k) in 1 and
2, and pairs of 15 to ~150 tokens: the window, the per-layer theta and RoPE positions restarting
for each pair all change the scores. One scores with "cls" pooling and one label (sigmoid), the
other with "mean" pooling, two labels (softmax) and LayerNorm biases.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
from litestar.testing import TestClient

from adapters.base import ScoreJob
from adapters.registry import build_engine
from gateway.app import create_app
from gateway.config import settings as settings_module
from gateway.config.settings import load_settings
from schemas.config import PackedEngineConfig, Settings, packed_encoder_refusal
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_modernbert

pytestmark = pytest.mark.anyio
TOL = 1e-5
KINDS = ("cls", "mean")
QUERIES = (Q, "capital punishment", "Which fox is quick and brown, and which dog is lazy?")
# Pairs of ~60-120 tokens (the tiny BPE splits words): well past the ±8 window.
LONG = [
    "Washington, D.C. is the capital of the United States. It is a federal district. " * 2,
    "Quantum computing uses qubits. Text rerank models are widely used in search engines. The capital of France is Paris.",
]
ALL_DOCS = [*DOCS, *LONG]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("packed-modernbert")
    return {"cls": build_tiny_modernbert(base / "cls", pooling="cls"),
            "mean": build_tiny_modernbert(base / "mean", pooling="mean", id2label={0: "irrelevant", 1: "relevant"}, seed=1)}


def _config(path: Path, **kw) -> PackedEngineConfig:
    # A 200-token budget: a request spans several steps, and concurrent requests share them.
    return PackedEngineConfig(name="p", path=str(path), devices=("cpu",), batch_tokens=200, **kw)


@pytest.fixture(scope="module")
async def engines(dirs):
    started = {}
    for kind in KINDS:
        eng = build_engine(_config(dirs[kind]))
        await eng.start()
        started[kind] = eng
    yield started
    for eng in started.values():
        await eng.stop()


def _job(engine, query: str, docs: list[str], raw: bool = False) -> ScoreJob:
    tok = engine.tokenizer
    return ScoreJob(query=query, instruction="", shared_ids=tok.encode_shared(query, ""),
                    item_ids=tok.encode_documents(docs), raw_scores=raw)


_ST: dict[str, object] = {}


def _st(path: Path, query: str, docs: list[str]) -> list[float]:
    """sentence-transformers' scores (padded batches); two labels: softmax, the positive (last) label."""
    import sentence_transformers as st

    model = _ST.get(str(path)) or _ST.setdefault(str(path), st.CrossEncoder(str(path), device="cpu"))
    out = model.predict([(query, d) for d in docs], apply_softmax=True)
    return [float(s[-1]) if getattr(s, "ndim", 0) else float(s) for s in out]


def _padded_logits(path: Path, query: str, docs: list[str]) -> list[list[float]]:
    """Plain transformers, eager attention, all pairs in one padded batch (fp32)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    enc = tok([query] * len(docs), docs, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.tolist()


async def test_the_pairs_outgrow_the_local_window(engines):
    eng = engines["cls"]
    window = eng._replicas[0].window
    assert window == 8
    lens = [len(eng.tokenizer.row(eng.tokenizer.encode_shared(Q, ""), d).ids) for d in eng.tokenizer.encode_documents(ALL_DOCS)]
    assert max(lens) > 8 * window and sum(n > 2 * window + 1 for n in lens) >= 5, lens


@pytest.mark.parametrize("kind", KINDS)
async def test_scores_equal_sentence_transformers(engines, dirs, kind):
    eng = engines[kind]
    assert type(eng._replicas[0]).__name__ == "PackedModernBertReplica" and eng._replicas[0].pooling == kind
    assert eng.stats()["attention"] == "sdpa per sequence; local layers: sdpa per sequence, window ±8"
    result = await eng.score(_job(eng, Q, ALL_DOCS))
    expected = _st(dirs[kind], Q, ALL_DOCS)
    assert result.scores == pytest.approx(expected, abs=TOL)
    assert max(expected) - min(expected) > 0.01  # the tiny model really discriminates


@pytest.mark.parametrize("kind", KINDS)
async def test_raw_logits_equal_padded_transformers(engines, dirs, kind):
    eng = engines[kind]
    family, replica = eng._family, eng._replicas[0]
    shared = family.tokenizer.encode_shared(Q, "")
    rows = [family.tokenizer.row(shared, d) for d in family.tokenizer.encode_documents(ALL_DOCS)]
    got = replica.score([r.ids for r in rows])
    want = _padded_logits(dirs[kind], Q, ALL_DOCS)
    assert [x for row in got for x in row] == pytest.approx([x for row in want for x in row], abs=TOL)


@pytest.mark.parametrize("kind", KINDS)
async def test_one_step_of_mixed_queries_equals_each_pair_alone(engines, dirs, kind):
    """Pairs of three queries in one packed step: RoPE positions and the mean's segments restart per pair."""
    eng = engines[kind]
    family, replica = eng._family, eng._replicas[0]
    rows, want = [], []
    for q in QUERIES:
        shared = family.tokenizer.encode_shared(q, "")
        rows += [family.tokenizer.row(shared, d) for d in family.tokenizer.encode_documents(ALL_DOCS)]
        want += _st(dirs[kind], q, ALL_DOCS)
    assert rows[0].segment_start is None  # ModernBERT pairs carry no token types
    logits = replica.score([r.ids for r in rows], [r.segment_start for r in rows])
    assert family.scores(_job(eng, Q, ALL_DOCS), logits) == pytest.approx(want, abs=TOL)


async def test_rope_positions_restart_for_each_pair(engines, monkeypatch):
    """RoPE attention depends on i - j only, so a constant offset per pair hides from the scores in
    fp32 (it costs precision far into a long step, and a scaled RoPE type reads the positions
    themselves): the positions handed to the model's rotary module are checked directly."""
    eng = engines["cls"]
    family, replica = eng._family, eng._replicas[0]
    seen = []
    rotary = replica._rotary

    def spy(x, position_ids, layer_type):
        seen.append((layer_type, position_ids.tolist()))
        return rotary(x, position_ids, layer_type)

    monkeypatch.setattr(replica, "_rotary", spy)
    rows = [family.tokenizer.row(family.tokenizer.encode_shared(q, ""), d).ids
            for q in QUERIES for d in family.tokenizer.encode_documents(LONG)]
    replica.score(rows)
    want = [[p for r in rows for p in range(len(r))]]
    assert sorted(t for t, _ in seen) == ["full_attention", "sliding_attention"]
    assert all(pos == want for _, pos in seen)


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_requests_share_steps_and_keep_their_scores(engines, dirs, kind):
    eng = engines[kind]

    def shared_steps() -> int:
        return sum(n for k, n in eng.stats()["steps_by_requests"].items() if int(k) > 1)

    before = shared_steps()
    docs = [DOCS[0], DOCS[2], *LONG]
    pairs = [(q, d) for q in QUERIES for d in docs]
    results = await asyncio.gather(*(eng.score(_job(eng, q, [d])) for q, d in pairs))
    assert shared_steps() > before
    for q in QUERIES:
        got = [res.scores[0] for (qq, _), res in zip(pairs, results, strict=True) if qq == q]
        assert got == pytest.approx(_st(dirs[kind], q, docs), abs=TOL)


def test_http_rerank_equals_sentence_transformers(dirs):
    model = PackedEngineConfig(name="mb", path=str(dirs["mean"]), devices=("cpu",))
    with TestClient(create_app(Settings(models=(model,)), configure_logs=False)) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").text
            time.sleep(0.05)
        body = client.post("/v1/rerank", json={"model": "mb", "query": Q, "documents": ALL_DOCS}).json()
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        assert [got[i] for i in range(len(ALL_DOCS))] == pytest.approx(_st(dirs["mean"], Q, ALL_DOCS), abs=TOL)
        status = client.get("/ready").json()["models"][0]
        assert (status["engine"], status["family"], status["runtime"]) == ("packed", "cross-encoder", "packed")


def test_banded_sdpa_equals_a_dense_masked_reference():
    """The CPU kernel of the local layers: |i - j| <= window, per sequence, as transformers' mask."""
    import torch

    from adapters.runtimes.packed import kernels

    name, attend = kernels.pick_attention("auto", torch.device("cpu"), causal=False, window=3)
    assert name == "sdpa per sequence, window ±3" and kernels.needs_lengths(attend)
    g = torch.Generator().manual_seed(0)
    lens = [11, 2, 4, 9]  # shorter than the band (no mask) and longer
    q, k, v = (torch.randn(sum(lens), 2, 16, generator=g) for _ in range(3))
    got = attend(q, k, v, None, None, None, None, lens, lens)
    want = []
    for qi, ki, vi in zip(q.split(lens), k.split(lens), v.split(lens), strict=True):
        pos = torch.arange(qi.shape[0])
        s = torch.einsum("qhd,khd->hqk", qi, ki) / 16**0.5
        s = s.masked_fill((pos[:, None] - pos[None, :]).abs() > 3, float("-inf"))
        want.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vi))
    assert torch.allclose(got, torch.cat(want), atol=1e-6)
    with pytest.raises(ValueError, match="bidirectional"):
        kernels.pick_attention("auto", torch.device("cpu"), causal=True, window=3)


def test_modernbert_is_no_longer_refused_and_deberta_still_is(dirs):
    import json

    assert packed_encoder_refusal(json.loads((dirs["cls"] / "config.json").read_text())) is None
    why = packed_encoder_refusal({"model_type": "deberta-v2", "architectures": ["DebertaV2ForSequenceClassification"]})
    assert why is not None and "not model_type 'deberta-v2'" in why and "\n" not in why


def test_default_engine_on_a_gpu_is_packed_for_modernbert(monkeypatch, dirs):
    monkeypatch.setattr(settings_module, "_engine_registered", lambda kind: True)
    monkeypatch.setattr(settings_module.importlib.util, "find_spec", lambda name: object() if name == "transformers" else None)
    monkeypatch.setattr(settings_module, "cuda_present", lambda: True)
    settings = load_settings(environ={"RERANK_MODELS__0__PATH": str(dirs["mean"])})
    assert settings.models[0].__struct_config__.tag == "packed"
    monkeypatch.setattr(settings_module, "cuda_present", lambda: False)
    settings = load_settings(environ={"RERANK_MODELS__0__PATH": str(dirs["mean"])})
    assert settings.models[0].__struct_config__.tag == "transformers"  # CPU default unchanged


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="torch.compile on CPU needs a C compiler")
async def test_compiled_regions_score_as_eager(dirs):
    """compile = "on" (the CUDA default) on CPU: add + LayerNorm, RoPE and GeGLU compiled; one pair and several."""
    eng = build_engine(_config(dirs["mean"], compile="on"))
    await eng.start()
    try:
        assert eng.stats()["compiled"] is True and "compile_error" not in eng.stats()
        for docs in (ALL_DOCS, LONG[:1]):  # a lone pair runs with a 1-token companion (one graph for both)
            result = await eng.score(_job(eng, Q, docs))
            assert result.scores == pytest.approx(_st(dirs["mean"], Q, docs), abs=TOL)
    finally:
        await eng.stop()
