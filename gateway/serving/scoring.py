"""Scoring texts on one configured model: from a model name and the request's texts to ``Scored``.

The model side of a rerank, shared by every path that scores on a configured model by name: a
rerank request (:class:`gateway.serving.service.RerankService`) and models made of others (a
cascade's stages, :mod:`gateway.serving.routing.cascade`, call :meth:`Scorer.score_documents`
back). A chain model routes to its targets (:mod:`gateway.serving.routing.chain`); any other
model is admitted against its ``max_concurrent_requests``, its engine's job is built
(:mod:`gateway.serving.jobs`; scored in parts when the engine overlaps tokenizing,
:mod:`gateway.serving.parts`), scored within its ``timeout_s``, the engine's answer checked, and a
document's chunks folded to their max. Apart from the service because none of the request's own
work is here -- the API key check, ``limits.max_documents``, the response cache, sorting,
``top_n``, the response, usage and metrics -- and a cascade's stages must not repeat it.
Nothing here imports Litestar.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any, cast

import msgspec

from adapters.base import (
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    EngineTimeoutError,
    ScoreJob,
)
from gateway.errors import RawScoresUnsupportedError, UnsupportedByEngineError
from gateway.observability import tracing
from gateway.serving.jobs import (
    CHUNK,
    CUT_RIGHT,
    LongTexts,
    dedup,
    token_job,
    top_n_hint,
    wants_raw_scores,
)
from gateway.serving.model_state import ModelRuntimeState
from gateway.serving.models import ModelRegistry, ModelRuntime
from gateway.serving.parts import _OVERLAP_MIN_DOCUMENTS, overlapped
from schemas.config import LimitsConfig

__all__ = ("Scored", "Scorer")


class Scored(msgspec.Struct, kw_only=True, frozen=True):
    """The scores of one request's documents, from :meth:`Scorer.score_documents`."""

    # One score per document, in the order given; when ``indices`` is set (the engine ranked and
    # cut to ``top_n`` itself), the score of document ``indices[k]`` only.
    scores: list[float]
    indices: list[int] | None
    input_tokens: int  # tokens the serving engine processed (usage and billing count these)
    items: int  # items scored (after dedup and chunking)
    queue_s: float
    tokenize_s: float
    inference_s: float
    target: str  # the configured model whose engine computed them (the model itself, or a chain's target)
    # (target, outcome) of each chain attempt, in order; () for a model served by its own engine.
    attempts: tuple[tuple[str, str], ...] = ()


class Scorer:
    """Scores on configured models by name; :class:`gateway.serving.service.RerankService` holds one."""

    def __init__(self, registry: ModelRegistry, limits: LimitsConfig) -> None:
        self._registry = registry
        self._limits = limits

    async def score_documents(
        self,
        model: str | ModelRuntime,
        *,
        query: str,
        texts: Sequence[str],
        instruction: str | None = None,
        max_tokens_per_doc: int | None = None,
        max_chunks_per_doc: int | None = None,
        long_texts: LongTexts = CHUNK,
        raw_scores: bool = False,
        top_n: int | None = None,
    ) -> Scored:
        """Score ``texts`` against ``query`` on configured model ``model`` (a name, alias or runtime), with chain routing.

        The entry point for anything that scores on a configured model by name: a rerank
        request, and models made of others (a cascade's stages). A chain model routes to its
        targets by its rules (:mod:`gateway.serving.routing.chain`: failover, spill-over,
        cooldowns, one deadline); any other model scores on its own engine within its
        ``timeout_s`` and admission bound. ``instruction`` None: the model's configured
        instruction, else its family's default. ``top_n``: a hint (upstreams may rank and cut;
        then ``Scored.indices`` is set). No API key check, response cache, usage record or
        metrics of the request: the caller owns those (``RerankService.rerank`` does them for its
        public name).
        Errors are the engines' and the gateway's (``gateway.errors`` maps them to statuses);
        ``Scored.target`` names the model whose engine computed the scores.
        """
        runtime = self._registry.get(model) if isinstance(model, str) else model
        if runtime.cascade is not None:  # stages scored through this same method (gateway.serving.routing.cascade)
            _admit(runtime)
            runtime.in_flight += 1
            try:
                return Scored(
                    **await runtime.cascade.score(
                        self.score_documents,
                        query=query,
                        texts=texts,
                        instruction=instruction,
                        max_tokens_per_doc=max_tokens_per_doc,
                        max_chunks_per_doc=max_chunks_per_doc,
                        long_texts=long_texts,
                        raw_scores=raw_scores,
                    )
                )
            finally:
                runtime.in_flight -= 1
        args = (query, list(texts), instruction, max_tokens_per_doc, max_chunks_per_doc, long_texts, raw_scores, top_n)
        chain = runtime.chain
        if chain is None:
            return await self._compute(runtime, *args)
        _admit(runtime)
        runtime.in_flight += 1
        try:
            routed = await chain.route(lambda target: self._compute_routed(target, *args))
        finally:
            runtime.in_flight -= 1
        scored: Scored = routed.value
        # A target that is a chain itself brings its own attempts, ending in the one that served.
        attempts = (*routed.attempts[:-1], *scored.attempts) if scored.attempts else tuple(routed.attempts)
        return msgspec.structs.replace(scored, attempts=attempts)

    async def _compute_routed(self, target: ModelRuntimeState, *args: Any) -> Scored:
        """One chain attempt: the target scores on its engine, or routes on if it is a chain itself."""
        runtime = cast(ModelRuntime, target)  # the registry's runtimes, as the chain was given them
        if runtime.chain is not None:
            return await self.score_documents(
                runtime,
                query=args[0],
                texts=args[1],
                instruction=args[2],
                max_tokens_per_doc=args[3],
                max_chunks_per_doc=args[4],
                long_texts=args[5],
                raw_scores=args[6],
                top_n=args[7],
            )
        return await self._compute(runtime, *args)

    async def _compute(
        self,
        runtime: ModelRuntime,
        query: str,
        texts: list[str],
        instruction: str | None,
        max_tokens: int | None,
        max_chunks_per_doc: int | None,
        long_texts: LongTexts,
        raw_scores: bool,
        top_n: int | None,
    ) -> Scored:
        """The request's documents scored on ``runtime``'s own engine: build the job, score, fold chunks."""
        engine = runtime.usable_engine()
        if instruction is None:
            instruction = getattr(runtime.config, "instruction", None)
        if instruction is None:
            instruction = getattr(engine.tokenizer, "default_instruction", "")
        if raw_scores and not getattr(engine, "supports_raw_scores", False):
            raise RawScoresUnsupportedError(
                f"raw scores are not available for model '{runtime.name}': its engine ({runtime.kind}) "
                "outputs only relevance scores in [0, 1]; ask without raw scores"
            )
        if engine.tokenizer is None and long_texts not in (CHUNK, CUT_RIGHT):
            # Text engines (upstreams) cut long texts at the end themselves; the gateway cannot
            # count their tokens, so it can neither cut at the start nor refuse long texts.
            raise UnsupportedByEngineError(
                f"invalid request: model '{runtime.name}' ({runtime.kind}) is scored upstream, which "
                "truncates long texts at the end itself; the gateway cannot count their tokens to cut at "
                "the start or to refuse them: leave `truncate` unset or send `truncate: true` with `Right`"
            )
        _admit(runtime)
        runtime.in_flight += 1
        try:
            unique, positions = dedup(texts)
            t0 = time.perf_counter()
            tokenizer = engine.tokenizer
            owners: Sequence[int]
            result = None
            if tokenizer is not None:
                configured_chunks: int = getattr(runtime.config, "max_chunks_per_doc", 1)
                max_chunks = max_chunks_per_doc or configured_chunks
                args = (tokenizer, query, instruction, unique, max_tokens, max_chunks, long_texts, raw_scores)
                if (
                    getattr(engine, "overlaps_tokenizing", False)
                    and len(unique) >= _OVERLAP_MIN_DOCUMENTS
                    and runtime.in_flight == 1
                ):
                    job, owners, t1, result = await overlapped(self._limits, self._score, runtime, *args)
                else:
                    with tracing.span("tokenize", **{"rerank.documents": len(unique)}):
                        job, owners = await token_job(self._limits, *args)
            else:
                job = ScoreJob(
                    query=query,
                    instruction=instruction,
                    texts=unique,
                    max_tokens_per_doc=max_tokens,
                    raw_scores=raw_scores,
                    top_n=top_n_hint(top_n, len(texts), len(unique)),
                )
                owners = range(len(unique))
            if result is None:
                if wants_raw_scores(runtime, engine):
                    job = msgspec.structs.replace(job, raw_scores=True)
                t1 = time.perf_counter()
                result = await self._score(runtime, job)
            t2 = time.perf_counter()
        finally:
            runtime.in_flight -= 1
        if result.indices is not None:
            scores, indices = result.scores, result.indices
        else:
            unique_scores = [-math.inf] * len(unique)
            for owner, score in zip(owners, result.scores, strict=True):
                unique_scores[owner] = max(unique_scores[owner], score)
            scores, indices = [unique_scores[p] for p in positions], None
        return Scored(
            scores=scores,
            indices=indices,
            input_tokens=result.input_tokens,
            items=job.size,
            queue_s=result.queue_s,
            tokenize_s=t1 - t0,
            inference_s=t2 - t1,
            target=runtime.name,
        )

    async def _score(self, runtime: ModelRuntime, job: ScoreJob) -> Any:
        engine = runtime.usable_engine()
        try:
            # In this task (wait_for would start another one per request).
            async with asyncio.timeout(runtime.config.timeout_s):
                with tracing.engine_span(runtime.name, runtime.kind, job.size) as span:
                    result = await engine.score(job)
                    tracing.engine_done(span, tokens=result.input_tokens, queue_s=result.queue_s)
        except TimeoutError:
            raise EngineTimeoutError(
                f"model '{runtime.name}' did not answer within {runtime.config.timeout_s:g}s (timeout_s)"
            ) from None
        except EngineTimeoutError as exc:  # an upstream's read_timeout_s or its own 504
            # The 504's log line is this message alone (gateway.errors): it must name the model.
            raise EngineTimeoutError(f"model '{runtime.name}': {exc}") from None
        except EngineDeadError as exc:
            runtime.engine_died(engine, exc)  # 503 for this request; restart in the background
            raise
        size = job.size
        if result.indices is not None:
            expected = min(job.top_n or size, size)
            if (
                job.top_n is None
                or len(result.scores) != expected
                or len(set(result.indices)) != expected
                or not all(0 <= i < size for i in result.indices)
            ):
                raise EngineError(f"engine returned {len(result.scores)} ranked scores for top_n {job.top_n}")
        elif len(result.scores) != size:
            raise EngineError(f"engine returned {len(result.scores)} scores for {size} items")
        if job.raw_scores:  # logits or cosines: any finite number
            if not all(math.isfinite(s) for s in result.scores):
                raise EngineError("engine returned a non-finite raw score (NaN or inf)")
        elif any(not (0.0 <= s <= 1.0) for s in result.scores):  # also catches NaN
            raise EngineError("engine returned a score outside [0, 1] (NaN?)")
        return result


def _admit(runtime: ModelRuntime) -> None:
    """503 + Retry-After when ``runtime`` holds its ``max_concurrent_requests`` already."""
    if runtime.in_flight >= runtime.config.max_concurrent_requests:
        raise EngineOverloadedError(
            f"model '{runtime.name}' is at its limit of {runtime.config.max_concurrent_requests} "
            "concurrent requests; retry shortly",
            retry_after=1,
        )
