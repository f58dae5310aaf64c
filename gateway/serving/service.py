"""Rerank domain logic, written once for every engine.

From a decoded request to a response: pick the model, take each document's rank text
(``text`` or the joined ``rank_fields``), dedup identical texts (scored once, the score copied
to every position), and for token engines tokenize, truncate to ``max_tokens_per_doc``, split
documents longer than the model's window into chunks (capped by ``max_chunks_per_doc``) whose
max is the document's score. Then sort (descending score, ties by index), cut to ``top_n`` and
echo documents if asked. Nothing here imports Litestar.

Every dialect (Cohere, Jina, TEI, vLLM's score API) ends up here; the two things only some
dialects can ask for are keyword options: :class:`LongTexts` (TEI's ``truncate`` and
``truncation_direction`` instead of chunk-and-max) and ``raw_scores`` (TEI's ``raw_scores``,
vLLM's ``use_activation: false``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from itertools import repeat
from typing import Any, Literal

import anyio.to_thread
import msgspec

from adapters.base import (
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    EngineTimeoutError,
    PromptTokenizer,
    ScoreJob,
)
from gateway.errors import InputTooLongError, InvalidRequestError, PayloadTooLargeError, RawScoresUnsupportedError
from gateway.security.auth import authorize_model, current_key_id, record_usage
from gateway.serving.cache import CachedAnswer, ResponseCache, cache_key
from gateway.serving.models import ModelRegistry, ModelRuntime
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
# Above this many characters, tokenization moves to a worker thread (the Rust tokenizer
# releases the GIL there); below it, the hop costs more than it saves. Measured on the H200
# (docs/benchmarks/gpu-h200-2026-11-30, run 3): lowering this to 2 kB, so 100-document
# requests tokenize in threads, tripled tokenize time under 16 clients (66 vs 23 ms per
# request: the Python side of the fast tokenizer contends for the GIL), so it stays high.
_THREAD_TOKENIZE_CHARS = 16_384
_json = msgspec.json.Encoder()


class LongTexts(msgspec.Struct, kw_only=True, frozen=True):
    """What to do with a document longer than the room the model's window leaves it.

    ``chunk`` (the gateway's default): split into chunks, score each, keep the max.
    ``truncate``: keep one window's worth of tokens, the first (``side="right"`` cuts the end)
    or the last (``side="left"``). ``reject``: answer 413 naming the lengths (TEI ``truncate:
    false``). Text engines (upstreams) truncate at the end themselves: they take ``chunk`` and
    ``truncate``/right only.
    """

    mode: Literal["chunk", "truncate", "reject"] = "chunk"
    side: Literal["right", "left"] = "right"


CHUNK = LongTexts()
_CUT_RIGHT = LongTexts(mode="truncate", side="right")


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


def dedup(texts: Sequence[str]) -> tuple[list[str], Sequence[int]]:
    """Unique texts in first-seen order, and for every input position its unique index."""
    if len(dict.fromkeys(texts)) == len(texts):  # no duplicates (the usual case): one C-level pass
        return list(texts), range(len(texts))
    index_of: dict[str, int] = {}
    positions = [index_of.setdefault(t, len(index_of)) for t in texts]
    return list(index_of), positions


def chunk_ids(ids: Sequence[int], size: int, max_chunks: int) -> list[Sequence[int]]:
    """Split into consecutive pieces of ``size`` tokens, keeping at most ``max_chunks``."""
    if not ids:
        return [ids]
    return [ids[i : i + size] for i in range(0, len(ids), size)][:max_chunks]


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
        if engine.tokenizer is None and long_texts not in (CHUNK, _CUT_RIGHT):
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
            if tokenizer is not None:
                max_chunks = request.max_chunks_per_doc or getattr(runtime.config, "max_chunks_per_doc", 1)
                job, owners = await self._token_job(
                    tokenizer, query, instruction, unique, max_tokens, max_chunks, long_texts, raw_scores
                )
            else:
                job = ScoreJob(
                    query=query,
                    instruction=instruction,
                    texts=unique,
                    max_tokens_per_doc=max_tokens,
                    raw_scores=raw_scores,
                    top_n=_top_n_hint(request.top_n, len(documents), len(unique)),
                )
                owners = range(len(unique))
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
        return cache_key(scope=scope, api_version=api_version, model=runtime.name, request=request, effective=effective)

    async def _token_job(
        self,
        tokenizer: PromptTokenizer,
        query: str,
        instruction: str,
        unique: list[str],
        max_tokens: int | None,
        max_chunks: int,
        long_texts: LongTexts = CHUNK,
        raw_scores: bool = False,
    ) -> tuple[ScoreJob, list[int]]:
        def encode() -> tuple[list[int], list[list[int]]]:
            return tokenizer.encode_shared(query, instruction), tokenizer.encode_documents(unique)

        if sum(map(len, unique)) > _THREAD_TOKENIZE_CHARS:
            shared, doc_ids = await anyio.to_thread.run_sync(encode)
        else:
            shared, doc_ids = encode()
        room = tokenizer.item_room(shared)
        if room < 1:  # the query is capped, so only a misconfigured model gets here
            raise InvalidRequestError("invalid request: the query leaves no room for documents in the model's window")
        items: list[Sequence[int]] = []
        owners: list[int] = []
        for owner, ids in enumerate(doc_ids):
            if max_tokens is not None:
                ids = ids[:max_tokens]
            if long_texts.mode == "chunk":
                pieces = chunk_ids(ids, room, max_chunks)
            elif len(ids) <= room:
                pieces = [ids]
            elif long_texts.mode == "truncate":
                pieces = [ids[:room] if long_texts.side == "right" else ids[len(ids) - room :]]
            else:
                total = len(shared) + len(ids) + tokenizer.suffix_length
                raise InputTooLongError(
                    f"Input validation error: `inputs` must have less than {tokenizer.max_length} tokens. "
                    f"Given: {total}; send `truncate: true` to cut long texts"
                )
            for piece in pieces:
                items.append(piece)
                owners.append(owner)
        if len(items) > self._limits.max_total_chunks:
            raise PayloadTooLargeError(
                f"too many chunks: the documents split into {len(items)} chunks > "
                f"{self._limits.max_total_chunks} (limits.max_total_chunks); lower max_chunks_per_doc "
                "or max_tokens_per_doc, or send fewer documents"
            )
        job = ScoreJob(query=query, instruction=instruction, shared_ids=shared, item_ids=items, raw_scores=raw_scores)
        return job, owners

    async def _score(self, runtime: ModelRuntime, job: ScoreJob) -> Any:
        engine = runtime.usable_engine()
        try:
            # In this task (wait_for would start another one per request).
            async with asyncio.timeout(runtime.config.timeout_s):
                result = await engine.score(job)
        except TimeoutError:
            raise EngineTimeoutError(f"model '{runtime.name}' did not answer within {runtime.config.timeout_s}s") from None
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


def wants_raw_scores(runtime: ModelRuntime, engine: Any) -> bool:
    """The model is configured for raw outputs (``raw_scores = true``) and its engine has them.

    ``create_family`` refuses ``raw_scores = true`` at start for families without raw outputs,
    so a started engine that lacks them means the model simply was not asked for them.
    """
    return bool(getattr(runtime.config, "raw_scores", False)) and bool(getattr(engine, "supports_raw_scores", False))


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


def _top_n_hint(top_n: int | None, documents: int, unique: int) -> int | None:
    """``ScoreJob.top_n`` when the engine may cut: a real cut and no duplicates folded together
    (a folded item stands for several documents, so the best items are not the best documents)."""
    if top_n is None or top_n >= documents or unique != documents:
        return None
    return top_n


def rank_texts(documents: Sequence[str | dict[str, Any]], rank_fields: list[str] | None) -> list[str]:
    """The text each document is ranked on."""
    if rank_fields is not None and not rank_fields:
        raise InvalidRequestError(
            "invalid request: rank_fields cannot be empty, it must either contain at least one field or be omitted"
        )
    if rank_fields is None and all(map(isinstance, documents, repeat(str))):
        return list(documents)  # plain strings (the usual case): checked at C speed
    texts: list[str] = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            texts.append(doc)
        elif rank_fields:
            parts = [f"{f}: {_field_text(doc[f])}" for f in rank_fields if f in doc and doc[f] is not None]
            if not parts and isinstance(doc.get("text"), str):
                parts = [doc["text"]]  # none of the fields: its text, so every schema-valid request ranks
            if not parts:
                raise InvalidRequestError(
                    f"invalid request: document {i} has none of the rank_fields {rank_fields} and no 'text'"
                )
            texts.append("\n".join(parts))
        else:
            text = doc.get("text")
            if not isinstance(text, str):
                kind = "an image document (not supported)" if "image" in doc else "an object without a string 'text' field"
                raise InvalidRequestError(
                    f"invalid request: document {i} is {kind}; send a 'text' field or name the fields "
                    "to rank on with rank_fields"
                )
            texts.append(text)
    return texts


def _field_text(value: Any) -> str:
    return value if isinstance(value, str) else _json.encode(value).decode()


def _as_document(doc: str | dict[str, Any]) -> dict[str, Any]:
    return {"text": doc} if isinstance(doc, str) else doc
