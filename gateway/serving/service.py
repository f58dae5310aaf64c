"""Rerank domain logic, written once for every engine.

From a decoded request to a response: pick the model, check the caller's key and the limits,
answer from the response cache when it is on, build the engine's job (rank texts, dedup, and for
token engines tokenize, truncate and chunk: :mod:`gateway.serving.jobs`), score it within the
model's timeout and check what the engine returned, take the max of a document's chunks as its
score, then sort (descending score, ties by index), cut to ``top_n`` and echo documents if asked.
An idle request to an engine that overlaps tokenizing is scored in parts
(:mod:`gateway.serving.parts`). Nothing here imports Litestar.

Every dialect (Cohere, Jina, TEI, vLLM's score API) ends up here; the two things only some
dialects can ask for are keyword options: :class:`LongTexts` (TEI's ``truncate`` and
``truncation_direction`` instead of chunk-and-max) and ``raw_scores`` (TEI's ``raw_scores``,
vLLM's ``use_activation: false``). The job-building names callers import from here
(``LongTexts``, ``CHUNK``, ``dedup``, ``chunk_ids``, ``wants_raw_scores``) live in
:mod:`gateway.serving.jobs` and are re-exported.
"""

from __future__ import annotations

import asyncio
import heapq
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
from gateway.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    RawScoresUnsupportedError,
    UnsupportedByEngineError,
)
from gateway.observability import tracing
from gateway.security.auth import authorize_model, current_key_id, record_usage
from gateway.serving.cache import CachedAnswer, ResponseCache, cache_key
from gateway.serving.jobs import (
    CHUNK,
    CUT_RIGHT,
    LongTexts,
    chunk_ids,
    dedup,
    rank_texts,
    token_job,
    top_n_hint,
    wants_raw_scores,
)
from gateway.serving.model_state import ModelRuntimeState
from gateway.serving.models import ModelRegistry, ModelRuntime
from gateway.serving.parts import _OVERLAP_MIN_DOCUMENTS, _OVERLAP_PARTS, overlapped  # noqa: F401  (tests read _PARTS here)
from gateway.serving.routing.chain import mixes_models
from gateway.serving.telemetry import current_timing, record_phases
from schemas.config import LimitsConfig
from schemas.rerank import (
    ApiVersion,
    BilledUnits,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    Tokens,
    Usage,
)

__all__ = ("CHUNK", "LongTexts", "RerankOutcome", "RerankService", "Scored", "chunk_ids", "dedup", "wants_raw_scores")

# Cohere v2's documented default for max_tokens_per_doc.
V2_DEFAULT_MAX_TOKENS_PER_DOC = 4096
_json = msgspec.json.Encoder()


class RerankOutcome(msgspec.Struct, kw_only=True, frozen=True):
    response: RerankResponse
    model: str
    documents: int
    items: int
    input_tokens: int
    tokenize_ms: float
    inference_ms: float
    # "hit" | "miss" when the response cache is on (the x-cache header), else None.
    cache: str | None = None
    # The configured model that computed the scores, when the request went through a chain
    # (the x-rerank-target header); None for a model served by its own engine.
    target: str | None = None
    attempts: str | None = None  # "target:outcome,..." when a chain tried more than one target


class Scored(msgspec.Struct, kw_only=True, frozen=True):
    """The scores of one request's documents, from :meth:`RerankService.score_documents`."""

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


class RerankService:
    def __init__(self, registry: ModelRegistry, limits: LimitsConfig, cache: ResponseCache | None = None) -> None:
        self._registry = registry
        self._limits = limits
        self.cache = cache

    async def rerank(
        self,
        request: RerankRequest,
        *,
        api_version: str,
        request_id: str,
        long_texts: LongTexts = CHUNK,
        raw_scores: bool = False,
    ) -> RerankOutcome:
        runtime = self._registry.get(request.model)
        authorize_model(runtime.name)  # 403 unless the caller's API key covers this canonical name
        query = request.query if isinstance(request.query, str) else request.query.text
        if not query.strip():
            raise InvalidRequestError("invalid request: query must not be empty or be only whitespace")
        documents = request.documents
        if not documents:
            raise InvalidRequestError("invalid request: list of documents must not be empty")
        if len(documents) > self._limits.max_documents:
            raise PayloadTooLargeError(
                f"too many documents: {len(documents)} > {self._limits.max_documents} (limits.max_documents)"
            )
        texts = rank_texts(documents, request.rank_fields)
        asked = request.instruction or request.instruct or None
        max_tokens = request.max_tokens_per_doc
        if max_tokens is None and api_version == "2":
            max_tokens = V2_DEFAULT_MAX_TOKENS_PER_DOC
        chain = runtime.chain

        key: str | None = None
        if self.cache is not None:
            # None: the model's default, which only its engine knows (an LLM reranker's family).
            instruction = asked or getattr(runtime.config, "instruction", None)
            key = self._cache_key(request, runtime, api_version, instruction, max_tokens, long_texts, raw_scores)
            with tracing.span("cache.lookup"):
                hit = await self.cache.get(key)
                tracing.annotate(**{"rerank.cache": "miss" if hit is None else "hit"})
            if hit is not None:
                return _answer_from_cache(hit, runtime.name, request_id)

        scored = await self.score_documents(
            runtime,
            query=query,
            texts=texts,
            instruction=asked,
            max_tokens_per_doc=max_tokens,
            max_chunks_per_doc=request.max_chunks_per_doc,
            long_texts=long_texts,
            raw_scores=raw_scores,
            top_n=request.top_n,
        )
        top_n = min(request.top_n or len(documents), len(documents))
        if scored.indices is not None:
            # The engine ranked and cut (job.top_n): items are the documents themselves.
            by_index = dict(zip(scored.indices, scored.scores, strict=True))
            order = sorted(by_index, key=lambda i: (-by_index[i], i))[:top_n]
            score_of: Any = by_index
        else:
            score_of = scored.scores
            order = rank_order(score_of, top_n)
        echo = bool(request.return_documents)
        results = [
            RerankResult(
                index=i,
                relevance_score=score_of[i],
                document=_as_document(documents[i]) if echo else None,
            )
            for i in order
        ]
        response = RerankResponse(
            id=request_id,
            results=results,
            meta=RerankMeta(
                api_version=ApiVersion(version=api_version),
                billed_units=BilledUnits(search_units=max(1, math.ceil(scored.items / 100))),
                tokens=Tokens(input_tokens=scored.input_tokens),
            ),
            model=runtime.name,
            usage=Usage(total_tokens=scored.input_tokens),
        )
        record_phases(
            queue_s=scored.queue_s,
            tokenize_s=scored.tokenize_s,
            inference_s=scored.inference_s,
            documents=len(documents),
            items=scored.items,
        )
        record_usage(
            documents=len(documents),
            tokens=scored.input_tokens,
            search_units=response.meta.billed_units.search_units,
        )
        target = scored.target if chain is not None else None
        if self.cache is not None and key is not None:
            if (chain is None or chain.cacheable(scored.target)) and (
                runtime.cascade is None or not any(mixes_models(stage) for stage in runtime.cascade.stages)
            ):
                answer = CachedAnswer(_json.encode(response), len(documents), scored.items, scored.input_tokens, target)
                await self.cache.put(key, answer)
            _mark_cache("miss")
        return RerankOutcome(
            response=response,
            model=runtime.name,
            documents=len(documents),
            items=scored.items,
            input_tokens=scored.input_tokens,
            tokenize_ms=scored.tokenize_s * 1e3,
            inference_ms=scored.inference_s * 1e3,
            cache="miss" if key is not None else None,
            target=target,
            # What the chain went through before that target served (the access log line).
            attempts=",".join(f"{n}:{o}" for n, o in scored.attempts) if len(scored.attempts) > 1 else None,
        )

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
        metrics of the request: the caller owns those (``rerank`` does them for its public name).
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

    def _cache_key(
        self,
        request: RerankRequest,
        runtime: ModelRuntime,
        api_version: str,
        instruction: str | None,
        max_tokens: int | None,
        long_texts: LongTexts,
        raw_scores: bool,
    ) -> str:
        assert self.cache is not None
        scope = "*" if self.cache.shared_across_keys else (current_key_id() or "-")
        effective = {
            "instruction": instruction,
            "max_tokens_per_doc": max_tokens,
            "max_chunks_per_doc": request.max_chunks_per_doc or getattr(runtime.config, "max_chunks_per_doc", None),
            # The dialects' options (TEI's truncate/truncation_direction and raw_scores) change the answer too.
            "long_texts": msgspec.to_builtins(long_texts),
            "raw_scores": raw_scores,
        }
        chain = runtime.chain
        return cache_key(
            scope=scope,
            api_version=api_version,
            model=runtime.name,
            request=request,
            effective=effective,
            fingerprint=(
                chain.fingerprint
                if chain is not None
                else runtime.cascade.fingerprint
                if runtime.cascade is not None
                else runtime.fingerprint
            ),
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


_response_decoder = msgspec.json.Decoder(RerankResponse)


def rank_order(scores: Sequence[float], top_n: int) -> list[int]:
    """Indices of the ``top_n`` best scores: descending score, ties by index. A small ``top_n``
    of many documents keeps a heap of ``top_n`` (what ``sorted(...)[:top_n]`` gives, in
    n log top_n) instead of sorting them all."""

    def key(i: int) -> tuple[float, int]:
        return -scores[i], i

    if top_n * 8 <= len(scores):
        return heapq.nsmallest(top_n, range(len(scores)), key=key)
    return sorted(range(len(scores)), key=key)[:top_n]


def _admit(runtime: ModelRuntime) -> None:
    """503 + Retry-After when ``runtime`` holds its ``max_concurrent_requests`` already."""
    if runtime.in_flight >= runtime.config.max_concurrent_requests:
        raise EngineOverloadedError(
            f"model '{runtime.name}' is at its limit of {runtime.config.max_concurrent_requests} "
            "concurrent requests; retry shortly",
            retry_after=1,
        )


def _mark_cache(result: str) -> None:
    timing = current_timing()
    if timing is not None:
        timing.cache = result


def _answer_from_cache(hit: CachedAnswer, model: str, request_id: str) -> RerankOutcome:
    """A cache hit: the stored answer under this request's id. No engine tokens are charged."""
    response = msgspec.structs.replace(_response_decoder.decode(hit.response), id=request_id)
    record_usage(documents=hit.documents, tokens=0, search_units=0)
    _mark_cache("hit")
    return RerankOutcome(
        response=response,
        model=model,
        documents=hit.documents,
        items=hit.items,
        input_tokens=0,
        tokenize_ms=0.0,
        inference_ms=0.0,
        cache="hit",
        target=hit.target,
    )


def _as_document(doc: str | dict[str, Any]) -> dict[str, Any]:
    return {"text": doc} if isinstance(doc, str) else doc
