"""Rerank domain logic, written once for every engine.

From a decoded request to a response: pick the model, take each document's rank text
(``text`` or the joined ``rank_fields``), dedup identical texts (scored once, the score copied
to every position), and for token engines tokenize, truncate to ``max_tokens_per_doc``, split
documents longer than the model's window into chunks (capped by ``max_chunks_per_doc``) whose
max is the document's score. Then sort (descending score, ties by index), cut to ``top_n`` and
echo documents if asked. Nothing here imports Litestar.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

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
from gateway.auth import authorize_model, record_usage
from gateway.errors import InvalidRequestError, PayloadTooLargeError
from gateway.models import ModelRegistry, ModelRuntime
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

__all__ = ("RerankOutcome", "RerankService", "chunk_ids", "dedup")

# Cohere v2's documented default for max_tokens_per_doc.
V2_DEFAULT_MAX_TOKENS_PER_DOC = 4096
# Above this many characters, tokenization moves to a worker thread (the Rust tokenizer
# releases the GIL there); below it, the hop costs more than it saves. Measured on the H200
# (docs/benchmarks/gpu-h200-2026-11-30, run 3): lowering this to 2 kB, so 100-document
# requests tokenize in threads, tripled tokenize time under 16 clients (66 vs 23 ms per
# request: the Python side of the fast tokenizer contends for the GIL), so it stays high.
_THREAD_TOKENIZE_CHARS = 16_384
_json = msgspec.json.Encoder()


class RerankOutcome(msgspec.Struct, kw_only=True, frozen=True):
    response: RerankResponse
    model: str
    documents: int
    items: int
    input_tokens: int
    tokenize_ms: float
    inference_ms: float


def dedup(texts: Sequence[str]) -> tuple[list[str], list[int]]:
    """Unique texts in first-seen order, and for every input position its unique index."""
    index_of: dict[str, int] = {}
    positions = [index_of.setdefault(t, len(index_of)) for t in texts]
    return list(index_of), positions


def chunk_ids(ids: Sequence[int], size: int, max_chunks: int) -> list[Sequence[int]]:
    """Split into consecutive pieces of ``size`` tokens, keeping at most ``max_chunks``."""
    if not ids:
        return [ids]
    return [ids[i : i + size] for i in range(0, len(ids), size)][:max_chunks]


class RerankService:
    def __init__(self, registry: ModelRegistry, limits: LimitsConfig) -> None:
        self._registry = registry
        self._limits = limits

    async def rerank(self, request: RerankRequest, *, api_version: str, request_id: str) -> RerankOutcome:
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
        instruction = request.instruction or request.instruct or getattr(runtime.config, "instruction", "")
        max_tokens = request.max_tokens_per_doc
        if max_tokens is None and api_version == "2":
            max_tokens = V2_DEFAULT_MAX_TOKENS_PER_DOC

        engine = runtime.usable_engine()
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
                job, owners = await self._token_job(tokenizer, query, instruction, unique, max_tokens, max_chunks)
            else:
                job = ScoreJob(
                    query=query,
                    instruction=instruction,
                    texts=unique,
                    max_tokens_per_doc=max_tokens,
                    top_n=_top_n_hint(request.top_n, len(documents), len(unique)),
                )
                owners = range(len(unique))
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
        record_usage(
            documents=len(documents),
            tokens=result.input_tokens,
            search_units=response.meta.billed_units.search_units,
        )
        return RerankOutcome(
            response=response,
            model=runtime.name,
            documents=len(documents),
            items=job.size,
            input_tokens=result.input_tokens,
            tokenize_ms=(t1 - t0) * 1e3,
            inference_ms=(t2 - t1) * 1e3,
        )

    async def _token_job(
        self,
        tokenizer: PromptTokenizer,
        query: str,
        instruction: str,
        unique: list[str],
        max_tokens: int | None,
        max_chunks: int,
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
            for chunk in chunk_ids(ids, room, max_chunks):
                items.append(chunk)
                owners.append(owner)
        if len(items) > self._limits.max_total_chunks:
            raise PayloadTooLargeError(
                f"too many chunks: the documents split into {len(items)} chunks > "
                f"{self._limits.max_total_chunks} (limits.max_total_chunks); lower max_chunks_per_doc "
                "or max_tokens_per_doc, or send fewer documents"
            )
        job = ScoreJob(query=query, instruction=instruction, shared_ids=shared, item_ids=items)
        return job, owners

    async def _score(self, runtime: ModelRuntime, job: ScoreJob) -> Any:
        engine = runtime.usable_engine()
        try:
            result = await asyncio.wait_for(engine.score(job), timeout=runtime.config.timeout_s)
        except TimeoutError:
            raise EngineTimeoutError(f"model '{runtime.name}' did not answer within {runtime.config.timeout_s}s") from None
        except EngineDeadError as exc:
            runtime.engine_died(engine, exc)  # 503 for this request; restart in the background
            raise
        if result.indices is not None:
            expected = min(job.top_n or job.size, job.size)
            if (
                job.top_n is None
                or len(result.scores) != expected
                or len(set(result.indices)) != expected
                or not all(0 <= i < job.size for i in result.indices)
            ):
                raise EngineError(f"engine returned {len(result.scores)} ranked scores for top_n {job.top_n}")
        elif len(result.scores) != job.size:
            raise EngineError(f"engine returned {len(result.scores)} scores for {job.size} items")
        if any(not (0.0 <= s <= 1.0) for s in result.scores):  # also catches NaN
            raise EngineError("engine returned a score outside [0, 1] (NaN?)")
        return result


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
    texts: list[str] = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            texts.append(doc)
        elif rank_fields:
            parts = [f"{f}: {_field_text(doc[f])}" for f in rank_fields if f in doc and doc[f] is not None]
            if not parts:
                raise InvalidRequestError(
                    f"invalid request: document {i} has none of the rank_fields {rank_fields}"
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
