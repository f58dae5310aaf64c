"""Requests over an upstream's limits, split into calls and merged back: shared by DashScope and
the hosted providers (Cohere, Jina, Voyage, Mixedbread, NVIDIA, Together, Bedrock).

A request is cut into consecutive slices, each within the upstream's documents-per-call and
tokens-per-call limits (:func:`plan_calls`); the slices are sent a few at a time, each call with
the upstream's retry policy (:func:`adapters.upstreams.http.call_with_retries`) inside the
request's deadline, and their scores are put back at their global positions
(:func:`score_in_calls`). The first call that fails cancels the others. :func:`score_texts` does
all of it for one job, within its model's settings.

Upstreams count tokens with their own tokenizers, which the gateway does not have: limits are
planned on :func:`estimate_tokens`, an estimate meant to err high.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from adapters.base import EngineError, ScoreJob, ScoreResult
from adapters.upstreams.http import call_with_retries, gather_or_cancel
from schemas.config import BedrockEngineConfig, DashScopeEngineConfig, HostedRerankConfig

__all__ = ("Call", "SplitConfig", "estimate_tokens", "place_scores", "plan_calls", "score_in_calls", "score_texts")

# One upstream call: the slice's scores in order, and the tokens the upstream says it counted (None: unsaid).
Call = Callable[[int, int], Awaitable[tuple[list[float], int | None]]]
# The models whose requests are split; score_texts reads the settings they all have.
SplitConfig = DashScopeEngineConfig | HostedRerankConfig | BedrockEngineConfig

_DROP_DIGITS = str.maketrans("", "", "0123456789")


def estimate_tokens(text: str) -> int:
    """Tokens an upstream will probably count for ``text``, erring high.

    BPE tokenizers average ~4 bytes per token in English and ~1 token per CJK character
    (3 UTF-8 bytes), so bytes / 3 overestimates both; digits are often one token each, so they
    count fully.
    """
    digits = len(text) - len(text.translate(_DROP_DIGITS))
    return math.ceil(len(text.encode("utf-8")) / 3) + math.ceil(2 * digits / 3)


def plan_calls(
    query_tokens: int, item_tokens: Sequence[int], *, max_items: int, max_request_tokens: int | None
) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` ranges, each within the item and request-token limits.

    A request counts as query tokens x documents + document tokens (DashScope's and Voyage's
    rule). An item that alone exceeds the request limit still gets a call of its own (the
    upstream truncates it). ``max_request_tokens=None``: documents per call is the only limit.
    """
    budget = math.inf if max_request_tokens is None else max_request_tokens
    calls: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, tokens in enumerate(item_tokens):
        cost = query_tokens + tokens
        if i > start and (i - start >= max_items or used + cost > budget):
            calls.append((start, i))
            start, used = i, 0
        used += cost
    calls.append((start, len(item_tokens)))
    return calls


def place_scores(results: Iterable[tuple[int, float]], size: int, upstream: str) -> list[float]:
    """The scores of one call's ``(index, score)`` results in item order; every index in range exactly once."""
    scores = [math.nan] * size
    count = 0
    for index, score in results:
        count += 1
        if 0 <= index < size and math.isfinite(score):
            scores[index] = score
    if count != size or any(math.isnan(s) for s in scores):
        raise EngineError(
            f"{upstream} returned {count} results (or a repeated, out-of-range or non-finite one) for {size} documents"
        )
    return scores


async def score_in_calls(
    calls: Sequence[tuple[int, int]],
    call: Call,
    *,
    estimate: Callable[[int, int], int],
    max_parallel: int,
    retries: int,
    initial_s: float,
    max_s: float,
    deadline: float,
) -> ScoreResult:
    """Run ``call`` for every slice (``max_parallel`` at a time, each retried as the upstream allows
    within ``deadline``, a ``time.monotonic()`` value) and merge: the scores in global order, and the
    tokens the upstream reported, or ``estimate(start, end)`` for a call that reported none."""
    limiter = asyncio.Semaphore(max_parallel)

    async def run(start: int, end: int) -> tuple[list[float], int]:
        async with limiter:
            scores, tokens = await call_with_retries(
                lambda: call(start, end),
                retries=retries,
                initial_s=initial_s,
                max_s=max_s,
                budget_s=max(0.0, deadline - time.monotonic()),
            )
        return scores, estimate(start, end) if tokens is None else tokens

    parts = await gather_or_cancel(*(run(s, e) for s, e in calls))
    return ScoreResult(
        scores=[score for part, _ in parts for score in part], input_tokens=sum(tokens for _, tokens in parts)
    )


async def score_texts(
    job: ScoreJob,
    call: Callable[[Sequence[str]], Awaitable[tuple[list[float], int | None]]],
    cfg: SplitConfig,
    *,
    item_cap: int | None = None,
    max_request_tokens: int | None = None,
) -> ScoreResult:
    """Score ``job.texts`` with ``call`` on consecutive slices within ``cfg``'s documents per call and
    ``max_request_tokens`` (:func:`plan_calls`, :func:`score_in_calls`), all within ``cfg.timeout_s``
    from now. ``item_cap``: the most tokens the upstream counts for the query or one item (None: no cap)."""
    deadline = time.monotonic() + cfg.timeout_s

    def count(text: str) -> int:
        tokens = estimate_tokens(text)
        return tokens if item_cap is None else min(tokens, item_cap)

    query_tokens = count(job.query)
    item_tokens = [count(t) for t in job.texts]
    calls = plan_calls(
        query_tokens, item_tokens, max_items=cfg.max_documents_per_call, max_request_tokens=max_request_tokens
    )
    return await score_in_calls(
        calls,
        lambda start, end: call(job.texts[start:end]),
        estimate=lambda start, end: query_tokens * (end - start) + sum(item_tokens[start:end]),
        max_parallel=cfg.max_parallel_calls,
        retries=cfg.retries,
        initial_s=cfg.backoff_initial_s,
        max_s=cfg.backoff_max_s,
        deadline=deadline,
    )
