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
import math
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from adapters.base import (
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    EngineTimeoutError,
    ScoreJob,
)
from gateway.errors import InvalidRequestError, PayloadTooLargeError, RawScoresUnsupportedError
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
from gateway.serving.models import ModelRegistry, ModelRuntime
from gateway.serving.parts import _OVERLAP_MIN_DOCUMENTS, _OVERLAP_PARTS, overlapped  # noqa: F401  (tests read _PARTS here)
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

__all__ = ("CHUNK", "LongTexts", "RerankOutcome", "RerankService", "chunk_ids", "dedup", "wants_raw_scores")

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
        # None: the model's default, which only its engine knows (an LLM reranker's family).
        instruction: str | None = (
            request.instruction or request.instruct or getattr(runtime.config, "instruction", None)
        )
        max_tokens = request.max_tokens_per_doc
        if max_tokens is None and api_version == "2":
            max_tokens = V2_DEFAULT_MAX_TOKENS_PER_DOC

        key: str | None = None
        if self.cache is not None:
            key = self._cache_key(request, runtime, api_version, instruction, max_tokens, long_texts, raw_scores)
            hit = await self.cache.get(key)
            if hit is not None:
                return _answer_from_cache(hit, runtime.name, request_id)

        engine = runtime.usable_engine()
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
            raise InvalidRequestError(
                f"invalid request: model '{runtime.name}' ({runtime.kind}) is scored upstream, which "
                "truncates long texts at the end itself; the gateway cannot count their tokens to cut at "
                "the start or to refuse them: leave `truncate` unset or send `truncate: true` with `Right`"
            )
        if runtime.in_flight >= runtime.config.max_concurrent_requests:
            raise EngineOverloadedError(
                f"model '{runtime.name}' is at its limit of {runtime.config.max_concurrent_requests} "
                "concurrent requests; retry shortly",
                retry_after=1,
            )
        runtime.in_flight += 1
        try:
            unique, positions = dedup(texts)
            t0 = time.perf_counter()
            tokenizer = engine.tokenizer
            owners: Sequence[int]
            result = None
            if tokenizer is not None:
                max_chunks = request.max_chunks_per_doc or getattr(runtime.config, "max_chunks_per_doc", 1)
                args = (tokenizer, query, instruction, unique, max_tokens, max_chunks, long_texts, raw_scores)
                if (getattr(engine, "overlaps_tokenizing", False) and len(unique) >= _OVERLAP_MIN_DOCUMENTS
                        and runtime.in_flight == 1):
                    job, owners, t1, result = await overlapped(self._limits, self._score, runtime, *args)
                else:
                    job, owners = await token_job(self._limits, *args)
            else:
                job = ScoreJob(
                    query=query,
                    instruction=instruction,
                    texts=unique,
                    max_tokens_per_doc=max_tokens,
                    raw_scores=raw_scores,
                    top_n=top_n_hint(request.top_n, len(documents), len(unique)),
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

        top_n = min(request.top_n or len(documents), len(documents))
        if result.indices is not None:
            # The engine ranked and cut (job.top_n): items are the documents themselves.
            scores = dict(zip(result.indices, result.scores, strict=True))
            order = sorted(scores, key=lambda i: (-scores[i], i))[:top_n]
        else:
            unique_scores = [-math.inf] * len(unique)
            for owner, score in zip(owners, result.scores, strict=True):
                if score > unique_scores[owner]:
                    unique_scores[owner] = score
            scores = [unique_scores[p] for p in positions]
            order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))[:top_n]
        echo = bool(request.return_documents)
        results = [
            RerankResult(
                index=i,
                relevance_score=scores[i],
                document=_as_document(documents[i]) if echo else None,
            )
            for i in order
        ]
        response = RerankResponse(
            id=request_id,
            results=results,
            meta=RerankMeta(
                api_version=ApiVersion(version=api_version),
                billed_units=BilledUnits(search_units=max(1, math.ceil(job.size / 100))),
                tokens=Tokens(input_tokens=result.input_tokens),
            ),
            model=runtime.name,
            usage=Usage(total_tokens=result.input_tokens),
        )
        record_phases(
            queue_s=result.queue_s,
            tokenize_s=t1 - t0,
            inference_s=t2 - t1,
            documents=len(documents),
            items=job.size,
        )
        record_usage(
            documents=len(documents),
            tokens=result.input_tokens,
            search_units=response.meta.billed_units.search_units,
        )
        if self.cache is not None and key is not None:
            answer = CachedAnswer(_json.encode(response), len(documents), job.size, result.input_tokens)
            await self.cache.put(key, answer)
            _mark_cache("miss")
        return RerankOutcome(
            response=response,
            model=runtime.name,
            documents=len(documents),
            items=job.size,
            input_tokens=result.input_tokens,
            tokenize_ms=(t1 - t0) * 1e3,
            inference_ms=(t2 - t1) * 1e3,
            cache="miss" if key is not None else None,
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
        return cache_key(
            scope=scope,
            api_version=api_version,
            model=runtime.name,
            request=request,
            effective=effective,
            fingerprint=runtime.fingerprint,
        )

    async def _score(self, runtime: ModelRuntime, job: ScoreJob) -> Any:
        engine = runtime.usable_engine()
        try:
            # In this task (wait_for would start another one per request).
            async with asyncio.timeout(runtime.config.timeout_s):
                result = await engine.score(job)
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
    )


def _as_document(doc: str | dict[str, Any]) -> dict[str, Any]:
    return {"text": doc} if isinstance(doc, str) else doc
