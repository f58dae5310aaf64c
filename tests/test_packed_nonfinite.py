"""A packed cross-encoder step that returns non-finite logits for some pairs: those pairs are
scored once more in another step, and the answer is the one a clean run gives; non-finite again,
the request fails with the engine's 502 as before. Counted in the engine's stats (``/ready``).

Runs the packed engine on CPU (the tiny XLM-R of ``tests/test_overlap.py``); the replica's step
is wrapped to poison rows, as a device fault would."""

from __future__ import annotations

import math

import pytest

from adapters.base import EngineError
from gateway.serving.service import RerankService
from schemas.config import LimitsConfig
from tests.test_overlap import TEXTS, _request, served  # noqa: F401  (the fixture: the tiny XLM-R engine)

pytestmark = pytest.mark.anyio


async def _scores(registry, rt) -> dict[int, float]:
    rt.engine.overlaps_tokenizing = False
    out = await RerankService(registry, LimitsConfig()).rerank(_request(TEXTS[:30]), api_version="1", request_id="r")
    return {r.index: r.relevance_score for r in out.response.results}


def _poison(rt, steps: int) -> list[int]:
    """The replica's next ``steps`` steps return NaN for their first pair; returns the poisoned-step counter."""
    (replica,) = rt.engine._replicas
    score, poisoned = replica.score, [0]

    def wrapped(prompts, segments=None):
        rows = score(prompts, segments)
        if poisoned[0] < steps:
            poisoned[0] += 1
            rows[0] = [math.nan] * len(rows[0])
        return rows

    replica.score = wrapped
    return poisoned


async def test_nonfinite_rows_are_scored_again(served):
    registry, rt = served
    want = await _scores(registry, rt)
    before = rt.engine.stats()["nonfinite_retries"]
    poisoned = _poison(rt, steps=1)
    try:
        got = await _scores(registry, rt)
    finally:
        del rt.engine._replicas[0].score
    assert poisoned == [1]
    assert got == pytest.approx(want, abs=1e-6)
    assert rt.engine.stats()["nonfinite_retries"] == before + 1


async def test_the_second_try_is_launched_without_cuda_graphs(served, monkeypatch):
    """A replayed graph is what the GPU runs gave twice in a row non-finite: the retry is eager."""
    registry, rt = served
    scheduler = rt.engine._scheduler
    submit, kinds = scheduler.submit, []

    def recording(*args, eager=False, **kw):
        kinds.append(eager)
        return submit(*args, eager=eager, **kw)

    monkeypatch.setattr(scheduler, "submit", recording)
    _poison(rt, steps=1)
    try:
        await _scores(registry, rt)
    finally:
        del rt.engine._replicas[0].score
    assert kinds == [False, True]


async def test_nonfinite_again_is_the_engines_error(served):
    registry, rt = served
    _poison(rt, steps=10_000)
    try:
        with pytest.raises(EngineError, match="outside"):
            await _scores(registry, rt)
    finally:
        del rt.engine._replicas[0].score
    assert len(await _scores(registry, rt)) == 30  # and the engine keeps serving
