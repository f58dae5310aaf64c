"""Rerank domain logic, written once for every engine: the request's side.

From a decoded request to a response: pick the model, check the caller's key and the limits,
answer from the response cache when it is on, have the model score the documents
(:class:`gateway.serving.scoring.Scorer`: chain routing, admission, the engine's job -- rank texts,
dedup, and for token engines tokenize, truncate and chunk: :mod:`gateway.serving.jobs` -- scored
within the model's timeout and checked, a document's chunks folded to their max), then sort
(descending score, ties by index), cut to ``top_n``, echo documents if asked, and record usage and
the request's metrics. Nothing here imports Litestar.

Every dialect (Cohere, Jina, TEI, vLLM's score API) ends up here; the two things only some
dialects can ask for are keyword options: :class:`LongTexts` (TEI's ``truncate`` and
``truncation_direction`` instead of chunk-and-max) and ``raw_scores`` (TEI's ``raw_scores``,
vLLM's ``use_activation: false``). ``LongTexts`` and ``CHUNK``, the option's type and default,
live in :mod:`gateway.serving.jobs` and are re-exported with :meth:`RerankService.rerank`, which
takes them; the other job-building names are imported from there.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import msgspec

from gateway.errors import InvalidRequestError, PayloadTooLargeError
from gateway.observability import tracing
from gateway.security.auth import authorize_model, current_key_id, record_usage
from gateway.serving.cache import CachedAnswer, ResponseCache, cache_key
from gateway.serving.jobs import CHUNK, LongTexts, rank_texts
from gateway.serving.models import ModelRegistry, ModelRuntime
from gateway.serving.routing.chain import mixes_models
from gateway.serving.scoring import Scorer
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

__all__ = ("CHUNK", "LongTexts", "RerankOutcome", "RerankService")

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


class RerankService:
    def __init__(self, registry: ModelRegistry, limits: LimitsConfig, cache: ResponseCache | None = None) -> None:
        self._registry = registry
        self._limits = limits
        self.cache = cache
        # The model side (routing, admission, the engine call), shared with a cascade's stages.
        self._scorer = Scorer(registry, limits)

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

        scored = await self._scorer.score_documents(
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
