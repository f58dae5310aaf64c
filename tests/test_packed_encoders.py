"""Engine ``packed`` on cross-encoders (CPU: the exact per-pair SDPA fallback), against
sentence-transformers' ``CrossEncoder.predict`` (an independent implementation: its own
tokenization, padding and activation).

- XLM-R (bge-reranker), BERT (ms-marco-MiniLM, token types), ELECTRA (embedding projection) and
  ModernBERT (RoPE, local attention narrower than the pairs; "cls" pooling with one label, "mean"
  with two: more in test_packed_modernbert.py) score as sentence-transformers does within 1e-5 in
  fp32: alone, with pairs of several requests in one step (different queries: different
  token-type starts, RoPE positions restarting), through the HTTP API, and raw;
- a two-label head scores with softmax on its positive label, as the family says;
- an architecture the packed layers do not run (DeBERTa-v2) is refused with one line, at
  check-config and at start; fp8 is refused for ModernBERT;
- on a GPU machine the default engine is packed for a checkpoint it runs, not for one it cannot;
  without a GPU the default is unchanged.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest
from litestar.testing import TestClient

from adapters.base import EngineConfigError, ScoreJob
from adapters.registry import build_engine
from gateway.app import create_app
from gateway.config import settings as settings_module
from gateway.config.settings import ConfigError, load_settings
from gateway.launch.preflight import preflight
from schemas.config import PackedEngineConfig, Settings
from tests import reference_encoders as ref
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_cross_encoder, build_tiny_modernbert

pytestmark = pytest.mark.anyio
TOL = 1e-5
KINDS = ("xlmr", "bert", "electra", "modernbert", "modernbert-mean")
QUERIES = (Q, "capital punishment", "Which fox is quick and brown, and which dog is lazy?")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("packed-encoders")
    out = {
        kind: build_tiny_cross_encoder(base / kind, kind=kind) for kind in KINDS if not kind.startswith("modernbert")
    }
    out["modernbert"] = build_tiny_modernbert(base / "modernbert")
    out["modernbert-mean"] = build_tiny_modernbert(
        base / "modernbert-mean", pooling="mean", id2label={0: "irrelevant", 1: "relevant"}, seed=1
    )
    out["bert2"] = build_tiny_cross_encoder(base / "bert2", id2label={0: "irrelevant", 1: "relevant"}, seed=1)
    deberta = base / "deberta"
    deberta.mkdir()
    (deberta / "config.json").write_text(
        json.dumps(
            {"architectures": ["DebertaV2ForSequenceClassification"], "model_type": "deberta-v2", "num_labels": 1}
        )
    )
    out["deberta"] = deberta
    return out


def _config(path: Path, **kw) -> PackedEngineConfig:
    # A 200-token budget: a request spans several steps, and concurrent requests share them.
    return PackedEngineConfig(name="p", path=str(path), devices=("cpu",), batch_tokens=200, **kw)


@pytest.fixture(scope="module")
async def engines(dirs):
    started = {}
    for kind in (*KINDS, "bert2"):
        eng = build_engine(_config(dirs[kind]))
        await eng.start()
        started[kind] = eng
    yield started
    for eng in started.values():
        await eng.stop()


def _job(engine, query: str, docs: list[str], raw: bool = False) -> ScoreJob:
    tok = engine.tokenizer
    return ScoreJob(
        query=query,
        instruction="",
        shared_ids=tok.encode_shared(query, ""),
        item_ids=tok.encode_documents(docs),
        raw_scores=raw,
    )


def _st(path: Path, query: str, docs: list[str]) -> list[float]:
    """sentence-transformers' scores; a two-label head: softmax, the positive (last) label's probability."""
    import sentence_transformers as st

    out = st.CrossEncoder(str(path), device="cpu").predict([(query, d) for d in docs], apply_softmax=True)
    return [float(s[-1]) if getattr(s, "ndim", 0) else float(s) for s in out]


@pytest.mark.parametrize("kind", KINDS)
async def test_scores_equal_sentence_transformers(engines, dirs, kind):
    eng = engines[kind]
    assert type(eng).__name__ == "PackedEncoderEngine"
    assert eng.stats()["attention"].startswith("sdpa per sequence") and eng.describe()["family"] == "cross-encoder"
    result = await eng.score(_job(eng, Q, DOCS))
    expected = _st(dirs[kind], Q, DOCS)
    assert result.scores == pytest.approx(expected, abs=TOL)
    assert max(expected) - min(expected) > 0.01  # the tiny model really discriminates
    rows = [
        len(eng.tokenizer.encode_shared(Q, "")) + len(d) + eng.tokenizer.suffix_length
        for d in eng.tokenizer.encode_documents(DOCS)
    ]
    assert result.input_tokens == sum(rows)


@pytest.mark.parametrize("kind", KINDS)
async def test_one_step_of_mixed_queries_equals_each_pair_alone(engines, dirs, kind):
    """Pairs of three queries in one packed step: three token-type starts, position runs restarting."""
    eng = engines[kind]
    family, replica = eng._family, eng._replicas[0]
    rows, want = [], []
    for q in QUERIES:
        shared = family.tokenizer.encode_shared(q, "")
        rows += [family.tokenizer.row(shared, d) for d in family.tokenizer.encode_documents(DOCS)]
        want += _st(dirs[kind], q, DOCS)
    assert (rows[0].segment_start is not None) == (kind in ("bert", "electra"))  # BERT / ELECTRA pairs are typed
    logits = replica.score([r.ids for r in rows], [r.segment_start for r in rows])
    assert family.scores(_job(eng, Q, DOCS), logits) == pytest.approx(want, abs=TOL)


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_requests_share_steps_and_keep_their_scores(engines, dirs, kind):
    eng = engines[kind]

    def shared_steps() -> int:
        return sum(n for k, n in eng.stats()["steps_by_requests"].items() if int(k) > 1)

    before = shared_steps()
    pairs = [(q, d) for q in QUERIES for d in DOCS[:4]]
    results = await asyncio.gather(*(eng.score(_job(eng, q, [d])) for q, d in pairs))
    assert shared_steps() > before
    for q in QUERIES:
        got = [res.scores[0] for (qq, _), res in zip(pairs, results, strict=True) if qq == q]
        assert got == pytest.approx(_st(dirs[kind], q, DOCS[:4]), abs=TOL)


async def test_raw_scores_are_the_heads_logits(engines, dirs):
    eng = engines["bert"]
    result = await eng.score(_job(eng, Q, DOCS, raw=True))
    assert result.scores == pytest.approx([x[0] for x in ref.cross_logits(dirs["bert"], Q, DOCS)], abs=TOL)


async def test_two_label_head_is_softmax_of_the_positive_label(engines, dirs):
    eng = engines["bert2"]
    result = await eng.score(_job(eng, Q, DOCS))
    assert result.scores == pytest.approx(ref.cross_scores(dirs["bert2"], Q, DOCS, positive=1), abs=TOL)
    assert result.scores == pytest.approx(_st(dirs["bert2"], Q, DOCS), abs=TOL)


@pytest.mark.parametrize("kind", ["xlmr", "modernbert-mean"])
def test_http_rerank_equals_sentence_transformers(dirs, kind):
    model = PackedEngineConfig(name="ce", path=str(dirs[kind]), devices=("cpu",))
    with TestClient(create_app(Settings(models=(model,)), configure_logs=False)) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").text
            time.sleep(0.05)
        body = client.post("/v1/rerank", json={"model": "ce", "query": Q, "documents": DOCS}).json()
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        assert [got[i] for i in range(len(DOCS))] == pytest.approx(_st(dirs[kind], Q, DOCS), abs=TOL)
        status = client.get("/ready").json()["models"][0]
        assert (status["engine"], status["family"], status["runtime"]) == ("packed", "cross-encoder", "packed")
        assert status["engine_stats"]["requests"] == 1


async def test_unsupported_architecture_is_refused(dirs):
    settings = Settings(models=(PackedEngineConfig(name="d", path=str(dirs["deberta"])),))
    (finding,) = [f for f in preflight(settings).findings if f.refuses]
    assert (
        "runs BERT, ELECTRA, RoBERTa, XLM-R and ModernBERT cross-encoders, not model_type 'deberta-v2'"
        in finding.message
    )
    assert "\n" not in finding.message
    eng = build_engine(PackedEngineConfig(name="d", path=str(dirs["deberta"])))
    with pytest.raises(EngineConfigError, match="not model_type 'deberta-v2'; use engine = 'transformers'"):
        await eng.start()
    await eng.stop()


async def test_fp8_is_refused_for_modernbert(dirs):
    # BERT / ELECTRA / XLM-R run it (tests/test_packed_encoder_fp8.py); ModernBERT's layers have no FP8 forward.
    settings = Settings(models=(PackedEngineConfig(name="m", path=str(dirs["modernbert"]), precision="fp8"),))
    (finding,) = [f for f in preflight(settings).findings if f.refuses]
    assert "ModernBERT's layers (pre-norm, gated GeGLU MLP) have no FP8 forward yet" in finding.message
    eng = build_engine(_config(dirs["modernbert"], precision="fp8"))  # family "auto": refused once detected
    with pytest.raises(EngineConfigError, match="have no FP8 forward yet: drop precision"):
        await eng.start()
    await eng.stop()


@pytest.mark.anyio
async def test_a_pipeline_split_is_refused_for_cross_encoders(dirs):
    with pytest.raises(ValueError, match="split = 'pipeline' is for Qwen3"):
        PackedEngineConfig(name="x", family="cross-encoder", split="pipeline", devices=("cpu", "cpu"))
    eng = build_engine(
        PackedEngineConfig(name="p", path=str(dirs["bert"]), split="pipeline", devices=("cpu", "cpu"))
    )  # family detected at start
    with pytest.raises(EngineConfigError, match="split = 'pipeline' is for Qwen3 rerankers"):
        await eng.start()
    await eng.stop()


def test_default_engine_on_a_gpu_is_packed_where_it_runs(monkeypatch, dirs):
    monkeypatch.setattr(settings_module, "_engine_registered", lambda kind: True)
    present = {"transformers"}
    monkeypatch.setattr(settings_module.importlib.util, "find_spec", lambda name: object() if name in present else None)

    def engine_for(path: Path) -> str:
        return str(load_settings(environ={"RERANK_MODELS__0__PATH": str(path)}).models[0].__struct_config__.tag)

    monkeypatch.setattr(settings_module, "cuda_present", lambda: True)
    assert engine_for(dirs["xlmr"]) == "packed" and engine_for(dirs["bert"]) == "packed"
    assert engine_for(dirs["modernbert"]) == "packed"
    assert engine_for(dirs["deberta"]) == "transformers"  # packed cannot run it: the next choice
    explicit = load_settings(
        environ={"RERANK_MODELS__0__PATH": str(dirs["bert"]), "RERANK_MODELS__0__ENGINE": "transformers"}
    )
    assert explicit.models[0].__struct_config__.tag == "transformers"  # an explicit engine is kept
    monkeypatch.setattr(settings_module, "cuda_present", lambda: False)
    assert engine_for(dirs["xlmr"]) == "transformers"  # CPU default unchanged
    present.add("vllm")
    assert engine_for(dirs["xlmr"]) == "vllm-score"


def test_default_engine_reads_a_hub_id_from_the_local_cache(monkeypatch, dirs, tmp_path):
    """A DeBERTa cross-encoder named by hub id and already in the HF cache is not given packed
    (it would be refused at start); one not in the cache keeps packed (no network at config time)."""
    import huggingface_hub.constants

    monkeypatch.setattr(settings_module, "_engine_registered", lambda kind: True)
    monkeypatch.setattr(
        settings_module.importlib.util, "find_spec", lambda name: object() if name == "transformers" else None
    )
    monkeypatch.setattr(settings_module, "cuda_present", lambda: True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--deberta-reranker"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text((dirs["deberta"] / "config.json").read_text())

    def engine_for(path: str) -> str:
        return str(load_settings(environ={"RERANK_MODELS__0__PATH": path}).models[0].__struct_config__.tag)

    assert engine_for("org/deberta-reranker") == "transformers"
    assert engine_for("org/not-downloaded") == "packed"


def test_bi_encoder_on_packed_names_the_runtimes():
    with pytest.raises(ValueError, match="packed runs Qwen3 rerankers and cross-encoders"):
        PackedEngineConfig(name="x", family="bi-encoder")


def test_config_error_type():  # load_settings wraps the struct's ValueError in one line
    with pytest.raises(ConfigError, match="parity_set is the golden set of the FP8 ranking gate"):
        load_settings(
            environ={
                "RERANK_MODELS__0__FAMILY": "cross-encoder",
                "RERANK_MODELS__0__ENGINE": "packed",
                "RERANK_MODELS__0__PARITY_SET": "golden.jsonl",  # read only with precision = "fp8"
            }
        )


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="torch.compile on CPU needs a C compiler")
@pytest.mark.parametrize("kind", ["bert", "modernbert-mean"])
async def test_compiled_regions_score_as_eager(dirs, kind):
    """compile = "on" (the CUDA default) on CPU: residual + LayerNorm and GELU (ModernBERT: + RoPE,
    GeGLU) compiled, one pair and several."""
    eng = build_engine(_config(dirs[kind], compile="on"))
    await eng.start()
    try:
        assert eng.stats()["compiled"] is True and "compile_error" not in eng.stats()
        for docs in (DOCS, DOCS[:1]):  # a lone pair runs with a 1-token companion (one graph for both)
            result = await eng.score(_job(eng, Q, docs))
            assert result.scores == pytest.approx(_st(dirs[kind], Q, docs), abs=TOL)
    finally:
        await eng.stop()


async def test_the_reserving_step_fills_the_budget_with_valid_pairs(engines):
    from adapters.runtimes.packed.encoder import full_step

    eng = engines["bert"]
    family, (replica,) = eng._family, eng._replicas
    window = family.tokenizer.max_length
    for budget, items in ((4096, 1024), (4096, 3), (10, 1024)):
        prompts, segments = full_step(family, budget, items)
        tokens = sum(map(len, prompts))
        assert all(len(p) <= window for p in prompts) and len(prompts) <= items
        assert tokens <= max(budget, len(prompts[0])) and (tokens > budget - len(prompts[0]) or len(prompts) == items)
        assert all(s == segments[0] is not None for s in segments)  # BERT: token types from the document on
        assert len(replica.score(prompts, segments)) == len(prompts)
