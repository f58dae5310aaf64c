"""Review of ``gateway.serving.parts.overlapped``: when several parts fail (a device failing every step,
the engine stopping), the request answers with the first part's error and the others' errors
are retrieved too -- not left for asyncio to log "Task exception was never retrieved" with a
traceback at garbage collection, an error line per such request."""

from __future__ import annotations

import asyncio
import gc

import pytest

from adapters.base import EngineError
from gateway.serving.service import RerankService
from schemas.config import LimitsConfig
from tests.test_overlap_refusals import TEXTS, _request, served  # noqa: F401  (the fixture)

pytestmark = pytest.mark.anyio


async def test_parts_failing_leave_no_unretrieved_task_exception(served):
    registry, rt = served
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    old_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    calls: list[object] = []

    async def failing_score(job):  # e.g. the device failing every step: every part gets the error
        calls.append(job)
        if len(calls) == 1:  # the first part fails once the second has failed already
            while len(calls) < 2:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)
        raise EngineError("forward pass failed")

    rt.engine.overlaps_tokenizing = True
    rt.engine.score = failing_score
    try:
        with pytest.raises(EngineError):
            await RerankService(registry, LimitsConfig()).rerank(_request(TEXTS), api_version="1", request_id="r")
        assert len(calls) == 2  # no part is submitted once one has failed
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0)
    finally:
        del rt.engine.score
        rt.engine.overlaps_tokenizing = False
        loop.set_exception_handler(old_handler)
    assert [c.get("message") for c in reported] == []
    assert rt.in_flight == 0


async def test_a_failed_first_part_and_a_refused_later_one_leave_no_unretrieved_task_exception(served):
    from gateway.errors import InputTooLongError
    from gateway.serving.service import LongTexts

    registry, rt = served
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    old_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))

    async def failing_score(job):  # the first part fails at once, while the rest is tokenized
        raise EngineError("forward pass failed")

    rt.engine.overlaps_tokenizing = True
    rt.engine.score = failing_score
    try:
        with pytest.raises(InputTooLongError):  # document 50, in the last part
            await RerankService(registry, LimitsConfig()).rerank(
                _request(TEXTS), api_version="1", request_id="r", long_texts=LongTexts(mode="reject")
            )
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0)
    finally:
        del rt.engine.score
        rt.engine.overlaps_tokenizing = False
        loop.set_exception_handler(old_handler)
    assert [c.get("message") for c in reported] == []
    assert rt.in_flight == 0
