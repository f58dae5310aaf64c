"""A refined request whose reduced-precision batches are done when the engine stops (shutdown, a
restart) must still get fp32's order or an unavailable error (503): the stop dropped the fp32
model's infer requests under the refinement thread (an AssertionError, a 500), and a request
whose batches finished just before the stop skipped refinement silently (the reduced order)."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest

pytest.importorskip("openvino")

from adapters.base import EngineUnavailableError, ScoreJob
from adapters.runtimes.cpu import engine as ov_engine
from adapters.runtimes.cpu.engine import OpenVinoEngine
from schemas.config import OpenVinoEngineConfig
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_cross_encoder

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("rv-refine-stop")
    return build_tiny_cross_encoder(base / "m"), base / "cache"


async def _engine(model: tuple[Path, Path]) -> OpenVinoEngine:
    path, cache = model
    engine = OpenVinoEngine(
        OpenVinoEngineConfig(
            name="m",
            path=str(path),
            cache_dir=str(cache),
            streams=1,
            threads=2,
            precision="bf16",
            refine_top=10,
            refine_margin=100.0,
            parity_queries=8,
            parity_documents=12,
            parity_min_agreement=0.01,
        )
    )
    await engine.start()
    return engine


def _job(engine: OpenVinoEngine) -> ScoreJob:
    tok = engine.tokenizer
    assert tok is not None
    return ScoreJob(
        query=Q, instruction="", shared_ids=tok.encode_shared(Q, ""), item_ids=tok.encode_documents(DOCS * 2)
    )


async def test_a_stop_during_refinement_gives_fp32s_scores_or_unavailable(model, monkeypatch):
    engine = await _engine(model)
    job = _job(engine)
    want = (await engine.score(job)).scores  # a huge margin: every document re-scored in fp32
    entered, release = threading.Event(), threading.Event()
    real = ov_engine.refine

    def held(*args, **kwargs):
        entered.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(ov_engine, "refine", held)
    result: list[object] = []

    async def one() -> None:
        try:
            result.append((await engine.score(job)).scores)
        except EngineUnavailableError as exc:
            result.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        await anyio.to_thread.run_sync(entered.wait, 30)
        await engine.stop()
        release.set()
    got = result[0]
    assert isinstance(got, EngineUnavailableError) or got == pytest.approx(want, abs=1e-6), got


async def test_batches_done_before_a_stop_are_still_refined(model, monkeypatch):
    """The request read the fp32 pool before its batches ran: a stop clearing it in between must
    not skip refinement. No EngineUnavailableError is acceptable here -- the batcher is not stopped,
    only the pool reference cleared -- so the request must be answered, and refined."""
    engine = await _engine(model)
    job = _job(engine)
    want = (await engine.score(job)).scores
    real = ov_engine.RowBatcher.submit

    def submit_then_stop(self, payloads, lengths):
        pending = real(self, payloads, lengths)
        engine._exact = None  # what stop() does, between the batches' end and the refinement
        return pending

    monkeypatch.setattr(ov_engine.RowBatcher, "submit", submit_then_stop)
    refined_before = engine._refined[0]
    try:
        got = (await engine.score(job)).scores
    finally:
        monkeypatch.undo()
        await engine.stop()
    # Refinement ran for this request (a huge margin: documents re-scored in fp32) -- on this CPU
    # bf16 may compute in fp32 anyway, so equal scores alone would not show it -- and its scores
    # are the fp32 ones.
    assert engine._refined[0] > refined_before
    assert got == pytest.approx(want, abs=1e-6)
