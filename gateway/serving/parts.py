"""An idle request to a device engine, tokenized and scored in growing parts.

Engines that say ``overlaps_tokenizing`` (packed on CUDA) start on a request's first part while
the gateway tokenizes the next. :mod:`gateway.serving.scoring` decides when (``_OVERLAP_MIN_DOCUMENTS``,
the model's only request in flight) and calls :func:`overlapped` with its own ``_score``, so the
parts pass the same timeout and result checks as one job; everything else of the request stays
there (dedup, chunk-and-max) or in :mod:`gateway.serving.service` (cache, sort, response). Apart
because it is the one concurrent path in the scoring: its task handling (cancel, retrieve every
error) reads on its own here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from adapters.base import PromptTokenizer, ScoreJob, ScoreResult
from gateway.errors import InputTooLongError, PayloadTooLargeError
from gateway.serving.jobs import check_total_chunks, token_job, wants_raw_scores
from gateway.serving.models import ModelRuntime
from schemas.config import LimitsConfig

__all__ = ("overlapped",)

# Engines that say ``overlaps_tokenizing`` (packed on CUDA, steps replayed as CUDA graphs) get
# a request of at least this many distinct documents, when it is the model's only one in flight,
# in growing parts: the first tenth is tokenized and submitted, and the device starts on it
# while the next part is tokenized (the Rust tokenizer releases the GIL), and so on. The
# engine's scores do not depend on how items are grouped into steps (packed attention stays
# within each pair). Under load the device is busy with other requests anyway: one job.
_OVERLAP_MIN_DOCUMENTS = 64
# Where each part ends, as a share of the documents: parts of 12 %, 33 % and 55 %. On the H200 a
# token costs the device ~4x what it costs the host to tokenize (XLM-R large, report
# gpu-h200-2026-12-02-b), so each part is tokenized while the one before it computes, with room
# for the tokenizer's tail; a small first part starts the device early (the earlier two-part
# submit tokenized a quarter first: ~1.5 ms before the device had work). Each part is a step of
# its own, and a small step computes less efficiently: side by side (report
# gpu-h200-2026-12-02-c) three parts took the server 21.4-21.6 ms (p50) against 22.2 for four
# (10/20/30/40 %) and 24.1 for two (15/85 %, whose second part's tokenizing the device waits for).
# Of the three-part splits, 12/33/55 % left the shorter tail once no capture was in it (report
# gpu-h200-2026-12-02-d, call 3: d100 idle p99 24.3 ms against 26.3 for 10/30/60 %, p50 equal).
_OVERLAP_PARTS = (0.12, 0.45, 1.0)

# The scorer's ``_score`` (gateway.serving.scoring): one job within the model's timeout, its result checked.
Score = Callable[[ModelRuntime, ScoreJob], Awaitable[ScoreResult]]


async def overlapped(
    limits: LimitsConfig,
    score: Score,
    runtime: ModelRuntime,
    tokenizer: PromptTokenizer,
    query: str,
    instruction: str,
    unique: list[str],
    *rest: Any,
) -> tuple[ScoreJob, list[int], float, ScoreResult]:
    """Tokenize and submit the documents in growing parts (``_OVERLAP_PARTS``), each submitted
    as soon as it is tokenized, then wait for all: (the whole job, owners, when tokenizing
    ended, the whole result). Same checks and errors as one job; an error cancels every part
    already submitted, and the request answers with the first error in part order."""
    raw = wants_raw_scores(runtime, runtime.usable_engine())
    bounds = [0, *(max(1, int(f * len(unique))) for f in _OVERLAP_PARTS[:-1]), len(unique)]
    tasks: list[asyncio.Future[Any]] = []
    parts: list[tuple[ScoreJob, list[int]]] = []
    try:
        for lo, hi in itertools.pairwise(bounds):
            job, owners = await _part_job(limits, tokenizer, query, instruction, unique, slice(lo, hi), rest)
            if not parts:
                raw = raw or job.raw_scores  # the model's config, or the request (TEI's raw_scores)
            parts.append((job, [lo + o for o in owners]))
            if hi == len(unique):
                items = [i for part, _ in parts for i in part.item_ids]
                check_total_chunks(limits, len(items))  # each part was checked alone
                t1 = time.perf_counter()
            if any(t.done() and not t.cancelled() and t.exception() is not None for t in tasks):
                # A part failed: score no more (its error is raised below), but tokenize on,
                # so a refusal further on answers as one job would (before any scoring).
                continue
            tasks.append(asyncio.ensure_future(score(runtime, msgspec.structs.replace(job, raw_scores=raw))))
            await asyncio.sleep(0)  # the part's task runs to its submit: the engine starts on it now
        results = [await task for task in tasks]
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            elif not task.cancelled():
                task.exception()  # retrieved: the request answers with the first error only
    job = msgspec.structs.replace(parts[0][0], item_ids=items, raw_scores=raw)
    owners = [o for _, part_owners in parts for o in part_owners]
    result = ScoreResult(
        scores=[s for r in results for s in r.scores],
        input_tokens=sum(r.input_tokens for r in results),
        queue_s=results[0].queue_s,
    )
    return job, owners, t1, result


async def _part_job(
    limits: LimitsConfig,
    tokenizer: PromptTokenizer,
    query: str,
    instruction: str,
    unique: list[str],
    part: slice,
    rest: tuple[Any, ...],
) -> tuple[ScoreJob, list[int]]:
    """``token_job`` on ``unique[part]``. A part over ``limits.max_total_chunks`` refuses the
    request as one job does: with the whole request's chunk count, or with the 413 of a
    document too long further on (long_texts reject), which one job finds first. Only on that
    error path is the whole request tokenized once more."""
    try:
        return await token_job(limits, tokenizer, query, instruction, unique[part], *rest)
    except InputTooLongError:
        raise
    except PayloadTooLargeError:  # the part's chunk count
        await token_job(limits, tokenizer, query, instruction, unique, *rest)  # raises one job's error
        raise
