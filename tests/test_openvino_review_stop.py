"""Requests waiting in the OpenVINO engine when it stops (shutdown, or a restart after the engine
died) must fail as the engine being unavailable (503, retry), like a request arriving after the
stop, not with a bare RuntimeError (an unexpected 500 with a traceback in the log)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("openvino")

from adapters.base import EngineUnavailableError, ScoreJob
from adapters.runtimes.cpu.engine import OpenVinoEngine
from schemas.config import OpenVinoEngineConfig
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_cross_encoder

pytestmark = pytest.mark.anyio


async def test_requests_waiting_at_stop_fail_as_unavailable(tmp_path):
    path = build_tiny_cross_encoder(tmp_path / "m")
    engine = OpenVinoEngine(
        OpenVinoEngineConfig(
            name="m", path=str(path), cache_dir=str(tmp_path / "cache"), streams=1, threads=1, max_batch_size=1
        )
    )
    await engine.start()
    tok = engine.tokenizer
    assert tok is not None
    shared = tok.encode_shared(Q, "")
    job = ScoreJob(query=Q, instruction="", shared_ids=shared, item_ids=tok.encode_documents(DOCS * 40))
    waiting = asyncio.ensure_future(engine.score(job))
    await asyncio.sleep(0.05)  # its first rows run, most wait
    assert not waiting.done()
    await engine.stop()
    with pytest.raises(EngineUnavailableError):
        await waiting
    with pytest.raises(EngineUnavailableError):
        await engine.score(job)
