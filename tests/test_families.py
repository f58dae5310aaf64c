"""Families beyond Qwen3 on the transformers runtime, and family detection.

Tiny random checkpoints built offline (``tests.tiny_encoders``): BERT and XLM-R cross-encoders
(one label; three labels with the positive one in the middle), a BERT bi-encoder with
sentence-transformers files. Every score is checked against ``tests.reference_encoders``: plain
per-pair forwards sharing no code with the gateway, within 1e-5 in fp32.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import msgspec
import pytest
from litestar.testing import TestClient

from adapters.base import ScoreJob
from adapters.families.detect import FamilyNotDetectedError, detect_family, read_model_files
from adapters.runtimes.transformers import TransformersEngine
from gateway.app import create_app
from schemas.config import Settings, TransformersEngineConfig
from tests import reference_encoders as ref
from tests.corpus import DOCS, Q
from tests.loopback import wait_loaded
from tests.tiny_encoders import build_tiny_bi_encoder, build_tiny_cross_encoder, set_known_logit

TOL = 1e-5
pytestmark = pytest.mark.anyio
MULTI_LABELS = {0: "irrelevant", 1: "relevant", 2: "neutral"}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny-encoders")
    known = build_tiny_cross_encoder(base / "known", kind="xlmr")
    set_known_logit(known, 2.0)
    return {
        "bert": build_tiny_cross_encoder(base / "bert"),
        "xlmr": build_tiny_cross_encoder(base / "xlmr", kind="xlmr"),
        "multi": build_tiny_cross_encoder(base / "multi", id2label=MULTI_LABELS),
        "known": known,
        "bi": build_tiny_bi_encoder(base / "bi"),
        "bi-cls": build_tiny_bi_encoder(base / "bi-cls", pooling="cls"),
    }


async def _engine(path: Path, **kw: object) -> TransformersEngine:
    cfg = TransformersEngineConfig(name="m", path=str(path), dtype="float32", device="cpu", **kw)  # type: ignore[arg-type]
    engine = TransformersEngine(cfg)
    await engine.start()
    return engine


def _job(engine: TransformersEngine, query: str, docs: list[str], *, raw: bool = False) -> ScoreJob:
    tok = engine.tokenizer
    assert tok is not None
    return ScoreJob(
        query=query,
        instruction="",
        shared_ids=tok.encode_shared(query, ""),
        item_ids=tok.encode_documents(docs),
        raw_scores=raw,
    )


# -- detection ---------------------------------------------------------------------------------
def test_auto_detects_each_family(tiny_dirs, tiny_qwen3_dir):
    assert detect_family(read_model_files(str(tiny_qwen3_dir))).family == "qwen3"
    for name in ("bert", "xlmr", "multi"):
        found = detect_family(read_model_files(str(tiny_dirs[name])))
        assert found.family == "cross-encoder", found
        assert "ForSequenceClassification" in found.reason
    found = detect_family(read_model_files(str(tiny_dirs["bi"])))
    assert (found.family, "mean pooling" in found.reason) == ("bi-encoder", True)


def test_undetectable_model_fails_with_one_line_naming_the_field(tiny_dirs, tmp_path):
    # A bare BertModel: no classification head, no sentence-transformers files.
    bare = tmp_path / "bare"
    shutil.copytree(tiny_dirs["bi"], bare)
    (bare / "modules.json").unlink()
    with pytest.raises(FamilyNotDetectedError) as info:
        detect_family(read_model_files(str(bare)))
    line = info.value.for_field("models[0].family")
    assert "\n" not in line and "BertModel" in line and "set models[0].family to one of" in line

    # Through the gateway: the model fails at load with that line; the gateway keeps serving.
    settings = Settings(models=(TransformersEngineConfig(name="bare", path=str(bare), device="cpu"),))
    with TestClient(create_app(settings, configure_logs=False)) as client:
        wait_loaded(client, 60)
        model = client.get("/ready").json()["models"][0]
        assert model["state"] == "failed"
        # /ready keeps the cause in `error` and the gateway's one-line fix, naming the field, in `fix`.
        assert "cannot tell the model family" in model["error"] and "\n" not in model["fix"]
        assert model["fix"].startswith("cannot tell the model family") and "set models[0].family" in model["fix"]
        resp = client.post("/v1/rerank", json={"query": "q", "documents": ["d"]})
        assert resp.status_code == 503 and "models[0].family" in resp.json()["message"]


def test_invalid_family_runtime_combination_fails_at_config_check():
    with pytest.raises(
        msgspec.ValidationError, match=r"family 'bi-encoder' cannot run on engine 'vllm-generate'.*models\[0\]"
    ):
        msgspec.convert({"models": [{"engine": "vllm-generate", "name": "x", "family": "bi-encoder"}]}, Settings)


def test_detected_family_on_a_runtime_that_cannot_run_it_fails_at_start(tiny_dirs):
    from adapters.families import create_family
    from schemas.config import VllmGenerateEngineConfig

    cfg = VllmGenerateEngineConfig(name="m", path=str(tiny_dirs["bi"]))
    with pytest.raises(ValueError, match="is a bi-encoder model .*engine 'vllm-generate' cannot run"):
        create_family(cfg, "vllm-generate")


# -- cross-encoders ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bert", "xlmr"])
async def test_pair_tokens_equal_the_tokenizers_own_pair_encoding(tiny_dirs, kind):
    from transformers import AutoTokenizer

    engine = await _engine(tiny_dirs[kind])
    tok = AutoTokenizer.from_pretrained(tiny_dirs[kind])
    job = _job(engine, Q, DOCS)
    rows = engine._family.rows(job)  # type: ignore[union-attr]
    for doc, row in zip(DOCS, rows, strict=True):
        enc = tok(Q, doc, return_token_type_ids=True)
        assert row.ids == enc["input_ids"]
        types = (
            [0] * len(row.ids)
            if row.segment_start is None
            else [int(i >= row.segment_start) for i in range(len(row.ids))]
        )
        assert types == enc["token_type_ids"]
    if kind == "bert":  # BERT marks the document as segment 1; XLM-R has no token types
        assert rows[0].segment_start is not None
    else:
        assert rows[0].segment_start is None


@pytest.mark.parametrize("kind", ["bert", "xlmr"])
async def test_cross_encoder_scores_equal_reference(tiny_dirs, kind):
    engine = await _engine(tiny_dirs[kind], batch_tokens=96)  # several length-sorted batches
    result = await engine.score(_job(engine, Q, DOCS))
    expected = ref.cross_scores(tiny_dirs[kind], Q, DOCS)
    assert result.scores == pytest.approx(expected, abs=TOL)
    assert max(expected) - min(expected) > 0.01  # the scores really differ between documents
    raw = await engine.score(_job(engine, Q, DOCS, raw=True))
    assert raw.scores == pytest.approx([lg[0] for lg in ref.cross_logits(tiny_dirs[kind], Q, DOCS)], abs=TOL)


async def test_multi_label_head_takes_the_positive_label(tiny_dirs):
    engine = await _engine(tiny_dirs["multi"])
    family = engine._family
    assert family is not None and family.positive_label == 1  # "relevant" in id2label, not the last label
    result = await engine.score(_job(engine, Q, DOCS))
    assert result.scores == pytest.approx(ref.cross_scores(tiny_dirs["multi"], Q, DOCS, positive=1), abs=TOL)
    raw = await engine.score(_job(engine, Q, DOCS, raw=True))
    assert raw.scores == pytest.approx([lg[1] for lg in ref.cross_logits(tiny_dirs["multi"], Q, DOCS)], abs=TOL)


async def test_two_label_head_saved_without_id2label(tmp_path):
    """transformers 5 writes no id2label / num_labels for its default two labels: the family must
    read two labels (as from_pretrained builds), take label 1, and score like the reference."""
    path = build_tiny_cross_encoder(tmp_path / "two", num_labels=2)
    saved = json.loads((path / "config.json").read_text())
    assert "id2label" not in saved and "num_labels" not in saved  # what today's save_pretrained writes
    engine = await _engine(path)
    family = engine._family
    assert family is not None and family.num_labels == 2 and family.positive_label == 1
    result = await engine.score(_job(engine, Q, DOCS))
    assert result.scores == pytest.approx(ref.cross_scores(path, Q, DOCS, positive=1), abs=TOL)


async def test_activation_applied_once_on_a_known_logit(tiny_dirs):
    engine = await _engine(tiny_dirs["known"])
    result = await engine.score(_job(engine, Q, DOCS[:3]))
    once = 1 / (1 + math.exp(-2.0))  # 0.8808; applied twice it would be 0.7069
    assert result.scores == pytest.approx([once] * 3, abs=1e-6)
    raw = await engine.score(_job(engine, Q, DOCS[:3], raw=True))
    assert raw.scores == pytest.approx([2.0] * 3, abs=1e-6)


async def test_declared_activation_and_overrides(tiny_dirs, tmp_path):
    # A checkpoint declaring Identity (raw logits) still gets [0, 1] scores; raw_scores gives logits.
    declared = tmp_path / "declared"
    shutil.copytree(tiny_dirs["multi"], declared)
    cfg_path = declared / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["sentence_transformers"] = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
    cfg_path.write_text(json.dumps(cfg))
    engine = await _engine(declared, positive_label=2)
    family = engine._family
    assert family is not None and (family.activation, family.positive_label) == ("sigmoid", 2)
    result = await engine.score(_job(engine, Q, DOCS[:2]))
    logits = ref.cross_logits(declared, Q, DOCS[:2])
    assert result.scores == pytest.approx([1 / (1 + math.exp(-lg[2])) for lg in logits], abs=TOL)


async def test_cross_encoder_window_is_the_checkpoints(tiny_dirs):
    engine = await _engine(tiny_dirs["xlmr"])  # max_length 8192 configured, XLM-R holds 512
    tok = engine.tokenizer
    assert tok is not None and tok.max_length == 512
    assert tok.max_query_tokens <= (512 - 4) // 2  # type: ignore[attr-defined]


# -- bi-encoders -------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "pooling"), [("bi", "mean"), ("bi-cls", "cls")])
async def test_bi_encoder_scores_equal_reference(tiny_dirs, name, pooling):
    engine = await _engine(tiny_dirs[name], batch_tokens=64)
    family = engine._family
    assert family is not None and family.pooling == (pooling,)
    result = await engine.score(_job(engine, Q, DOCS))
    assert result.scores == pytest.approx(ref.bi_scores(tiny_dirs[name], Q, DOCS, pooling=pooling), abs=TOL)
    raw = await engine.score(_job(engine, Q, DOCS, raw=True))
    assert raw.scores == pytest.approx(ref.bi_scores(tiny_dirs[name], Q, DOCS, pooling=pooling, raw=True), abs=TOL)
    # The query is embedded once: one row more than there are documents.
    tok = engine.tokenizer
    assert tok is not None
    assert result.input_tokens == len(tok.encode_shared(Q, "")) + sum(len(d) + 2 for d in tok.encode_documents(DOCS))


async def test_bi_encoder_room_does_not_depend_on_the_query(tiny_dirs):
    engine = await _engine(tiny_dirs["bi"])
    tok = engine.tokenizer
    assert tok is not None and tok.max_length == 128  # sentence_bert_config.json max_seq_length
    short, long = tok.encode_shared("q", ""), tok.encode_shared(" ".join(["capital"] * 50), "")
    assert tok.item_room(short) == tok.item_room(long) == 128 - 2


# -- through the gateway -------------------------------------------------------------------------
def test_gateway_reports_families_and_serves_raw_scores(tiny_dirs):
    settings = Settings(
        models=(
            TransformersEngineConfig(name="ce", path=str(tiny_dirs["bert"]), device="cpu", max_length=64),
            TransformersEngineConfig(name="ce-raw", path=str(tiny_dirs["bert"]), device="cpu", raw_scores=True),
            TransformersEngineConfig(name="bi", path=str(tiny_dirs["bi"]), device="cpu", family="bi-encoder"),
        )
    )
    with TestClient(create_app(settings, configure_logs=False)) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").json()
            time.sleep(0.05)
        models = {m["name"]: m for m in client.get("/ready").json()["models"]}
        assert models["ce"]["family"] == "cross-encoder" and models["bi"]["family"] == "bi-encoder"
        assert {models["ce"][k] for k in ("runtime", "device", "dtype")} == {"transformers", "cpu", "float32"}
        cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
        assert (cards["ce"]["family"], cards["bi"]["family"], cards["ce"]["engine"]) == (
            "cross-encoder",
            "bi-encoder",
            "transformers",
        )

        raw = client.post("/v2/rerank", json={"model": "ce-raw", "query": Q, "documents": DOCS}).json()
        logits = ref.cross_logits(tiny_dirs["bert"], Q, DOCS)
        assert {r["index"]: r["relevance_score"] for r in raw["results"]} == pytest.approx(
            {i: lg[0] for i, lg in enumerate(logits)}, abs=TOL
        )

        # A document longer than the 64-token window is chunked and scores as its best chunk.
        long_doc = " ".join([DOCS[3]] * 12 + [DOCS[1]])
        body = client.post("/v2/rerank", json={"model": "ce", "query": Q, "documents": [long_doc]}).json()
        tok = __import__("transformers").AutoTokenizer.from_pretrained(tiny_dirs["bert"])
        doc_ids = tok(long_doc, add_special_tokens=False)["input_ids"]
        q_ids = tok(Q, add_special_tokens=False)["input_ids"]
        room = 64 - len(q_ids) - 3
        chunks = [tok.decode(doc_ids[i : i + room]) for i in range(0, len(doc_ids), room)]
        assert len(chunks) > 1
        best = max(ref.cross_scores(tiny_dirs["bert"], Q, chunks))
        assert body["results"][0]["relevance_score"] == pytest.approx(best, abs=1e-4)


# -- command line ------------------------------------------------------------------------------
def test_check_config_prints_the_family_and_serve_refuses_an_undetectable_one(tiny_dirs, tmp_path, capsys):
    from gateway.cli import main

    good = tmp_path / "good.toml"
    good.write_text(
        f'[[models]]\nname = "ce"\nengine = "transformers"\npath = "{tiny_dirs["xlmr"]}"\n'
        f'[[models]]\nname = "bi"\nengine = "transformers"\npath = "{tiny_dirs["bi"]}"\n'
        '[[models]]\nname = "hub"\nengine = "transformers"\npath = "BAAI/bge-reranker-v2-m3"\n'
    )
    assert main(["check-config", "--config", str(good)]) == 0
    out = capsys.readouterr().out
    assert (
        "model ce: engine=transformers family=cross-encoder (config.json architectures has XLMRobertaForSequenceClassification"
        in out
    )
    assert "model bi: engine=transformers family=bi-encoder (sentence-transformers modules.json" in out
    assert "model hub: engine=transformers family=auto (decided at start" in out

    bare = tmp_path / "bare"
    shutil.copytree(tiny_dirs["bi"], bare)
    (bare / "modules.json").unlink()
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[[models]]\nname = "bare"\nengine = "transformers"\npath = "{bare}"\n')
    for command in ("check-config", "serve"):
        assert main([command, "--config", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "set models[0].family to one of qwen3, cross-encoder" in err, err

    wrong = tmp_path / "wrong.toml"
    wrong.write_text(f'[[models]]\nname = "bi"\nengine = "vllm-score"\npath = "{tiny_dirs["bi"]}"\n')
    assert main(["check-config", "--config", str(wrong)]) == 2
    assert "models[0].engine: " in capsys.readouterr().err


def test_raw_scores_refused_for_a_family_without_raw_output(tiny_qwen3_dir):
    from adapters.families import create_family

    cfg = TransformersEngineConfig(name="q", path=str(tiny_qwen3_dir), raw_scores=True)
    with pytest.raises(ValueError, match="raw_scores = true: the qwen3 family has no raw output"):
        create_family(cfg, "transformers")


def test_qwen3_fp32_on_cuda_loads_eager_attention():
    """CUDA's fused SDPA kernels mis-scored left-padded fp32 batches on an H200 (0.44 off): eager there only."""
    import torch

    from adapters.families.qwen3 import attention_override

    assert attention_override(torch.device("cuda", 0), torch.float32) == {"attn_implementation": "eager"}
    assert attention_override("cuda", torch.bfloat16) == {}
    assert attention_override("cpu", torch.float32) == {}
