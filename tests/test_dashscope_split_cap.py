"""The DashScope engine (fast: the engine against the fake, no app)."""

from __future__ import annotations

import asyncio

from adapters.base import ScoreJob
from adapters.upstreams.dashscope import DashScopeEngine
from schemas.config import DashScopeEngineConfig
from tests.fake_dashscope import FakeDashScope

KEY = "sk-review-0123456789abcdef"
Q = "What is the capital of the United States?"


def _score(url: str, job: ScoreJob):
    async def go():
        engine = DashScopeEngine(
            DashScopeEngineConfig(name="ds", model="gte-rerank-v2", base_url=url, api_key=KEY, retries=0)
        )
        await engine.start()
        try:
            return await engine.score(job)
        finally:
            await engine.stop()

    return asyncio.run(go())


def test_client_max_tokens_per_doc_does_not_shrink_the_split_plan():
    # max_tokens_per_doc is not sent to DashScope (it has no such field), so DashScope counts
    # every document in full. Planning the split on the client's (smaller) cap undercounts the
    # call, which DashScope then refuses (400 -> the client's 422) instead of the promised split.
    docs = [f"{i} " + "lorem ipsum dolor sit amet " * 150 for i in range(40)]  # ~1,000 tokens each
    with FakeDashScope(api_key=KEY) as fake:
        result = _score(fake.url, ScoreJob(query=Q, instruction="", texts=docs, max_tokens_per_doc=16))
        assert len(result.scores) == 40
        assert len(fake.requests) >= 2  # split: 40 x ~1,000 tokens is over the 30,000 per request
