"""A large request to an engine that ``overlaps_tokenizing`` (packed with CUDA graphs, or
``overlap_tokenizing = "on"``) is tokenized and submitted in growing parts
(:func:`gateway.serving.parts.overlapped`) when it is the model's only request in flight: the same answer
as one job -- scores, order, dedup, chunk-and-max, usage -- and the same errors, with the parts
already submitted cancelled. Runs the packed engine on CPU (the tiny XLM-R), the flag set."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest

from gateway.errors import InputTooLongError, PayloadTooLargeError
from gateway.serving.models import ModelRegistry
from gateway.serving.parts import _OVERLAP_MIN_DOCUMENTS, _OVERLAP_PARTS
from gateway.serving.service import LongTexts, RerankService
from schemas.config import LimitsConfig, PackedEngineConfig, Settings
from schemas.rerank import RerankRequest
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_cross_encoder

pytestmark = pytest.mark.anyio

# A 96-token step budget: a pair or two per step, so a request spans many steps.
# 80 distinct documents, two of them repeated, one long enough to be chunked -- in the part
# tokenized last (the parts are documents 0-7, 8-23, 24-47 and 48-79), where owners are offset.
TEXTS = [f"{DOCS[i % len(DOCS)][:80]} number {i}" for i in range(80)]
TEXTS[50] = " ".join(DOCS) * 6
TEXTS += [TEXTS[3], TEXTS[60]]


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory):
    path = build_tiny_cross_encoder(tmp_path_factory.mktemp("overlap") / "xlmr", kind="xlmr")
    model = PackedEngineConfig(
        name="p", path=str(path), devices=("cpu",), batch_tokens=96, max_length=128, max_chunks_per_doc=4
    )
    registry = ModelRegistry(Settings(models=(model,)))
    rt = registry.get("p")
    await rt.load()
    yield registry, rt
    await registry.stop()


def _request(texts: list[str], **kw) -> RerankRequest:
    return msgspec.convert({"model": "p", "query": Q, "documents": texts, **kw}, RerankRequest)


async def _rerank(registry, rt, overlap: bool, texts: list[str], limits: LimitsConfig | None = None, **kw):
    rt.engine.overlaps_tokenizing = overlap
    service = RerankService(registry, limits or LimitsConfig())
    before = rt.engine.stats()["requests"]
    out = await service.rerank(_request(texts), api_version="1", request_id="r", **kw)
    return out, rt.engine.stats()["requests"] - before


async def test_two_parts_answer_as_one_job(served):
    registry, rt = served
    assert len(set(TEXTS)) >= _OVERLAP_MIN_DOCUMENTS
    one, submits_one = await _rerank(registry, rt, False, TEXTS)
    two, submits_two = await _rerank(registry, rt, True, TEXTS)
    assert (submits_one, submits_two) == (1, len(_OVERLAP_PARTS))  # the engine saw the request in parts
    assert one.items == two.items > len(set(TEXTS))  # the long document was chunked in both
    assert one.input_tokens == two.input_tokens and one.documents == two.documents
    # Steps group the pairs differently: equal within float rounding (so near-ties may swap).
    want = {r.index: r.relevance_score for r in one.response.results}
    got = {r.index: r.relevance_score for r in two.response.results}
    assert sorted(got) == list(range(len(TEXTS)))
    assert [got[i] for i in range(len(TEXTS))] == pytest.approx([want[i] for i in range(len(TEXTS))], abs=1e-6)
    assert got[80] == got[3] and got[81] == got[60]  # duplicates folded across the parts


async def test_a_small_request_is_one_job(served):
    registry, rt = served
    _, submits = await _rerank(registry, rt, True, TEXTS[: _OVERLAP_MIN_DOCUMENTS - 1])
    assert submits == 1


async def test_under_load_a_large_request_is_one_job(served):
    registry, rt = served
    rt.in_flight += 1  # another request of this model is being served: the device has work
    try:
        one, submits = await _rerank(registry, rt, True, TEXTS)
    finally:
        rt.in_flight -= 1
    assert submits == 1 and len(one.response.results) == len(TEXTS)


async def test_an_error_in_the_last_part_cancels_the_others(served):
    registry, rt = served
    dropped = rt.engine.stats()["dropped_items"]
    (replica,) = rt.engine._replicas
    gate, score = threading.Event(), replica.score
    replica.score = lambda *a: (gate.wait(10), score(*a))[1]  # the first step waits for the error
    try:
        with pytest.raises(InputTooLongError):  # document 50 is in the last part
            await _rerank(registry, rt, True, TEXTS, long_texts=LongTexts(mode="reject"))
    finally:
        gate.set()
        del replica.score
    deadline = time.monotonic() + 10
    while rt.engine.stats()["waiting_requests"] and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert rt.engine.stats()["waiting_requests"] == 0 and rt.in_flight == 0
    # 96-token steps: the parts' 48 pairs take several; those not yet taken were dropped.
    assert rt.engine.stats()["dropped_items"] > dropped
    # Each part alone is under the chunk limit, both together are not: refused as one job is.
    items = (await _rerank(registry, rt, False, TEXTS))[0].items
    with pytest.raises(PayloadTooLargeError, match="too many chunks"):
        await _rerank(registry, rt, True, TEXTS, limits=LimitsConfig(max_total_chunks=items - 1))
    assert rt.in_flight == 0
    out, _ = await _rerank(registry, rt, True, TEXTS)  # and the engine keeps serving
    assert len(out.response.results) == len(TEXTS)


@pytest.mark.parametrize(("configured", "expected"), [("on", True), ("off", False), ("auto", False)])
async def test_the_config_decides(served, configured, expected):
    """ "auto" overlaps where steps replay CUDA graphs: never on CPU."""
    from adapters.registry import build_engine

    _, rt = served
    engine = build_engine(msgspec.structs.replace(rt.config, overlap_tokenizing=configured))
    await engine.start()
    try:
        assert engine.overlaps_tokenizing is expected
        assert engine.stats()["overlap_tokenizing"] is expected
    finally:
        await engine.stop()


async def test_raw_scores_in_every_part(served):
    registry, rt = served
    one, _ = await _rerank(registry, rt, False, TEXTS, raw_scores=True)
    two, submits = await _rerank(registry, rt, True, TEXTS, raw_scores=True)
    want = {r.index: r.relevance_score for r in one.response.results}
    got = {r.index: r.relevance_score for r in two.response.results}
    assert submits == len(_OVERLAP_PARTS) and any(not 0 <= s <= 1 for s in want.values())  # logits, not probabilities
    assert [got[i] for i in range(len(TEXTS))] == pytest.approx([want[i] for i in range(len(TEXTS))], abs=1e-6)
