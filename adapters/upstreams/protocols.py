"""Request and response mapping for the rerank servers a pool can forward to.

Each protocol turns one :class:`UpstreamCall` (a query and its texts) into the upstream's
request body, and its answer back into one score per text, in the texts' order, plus the
tokens it reports. We always ask for every score, no documents echoed and activated
(0..1) scores: ordering, ``top_n`` and echo are the gateway's job.

| protocol     | path         | texts field  | scores in                       | tokens from                     |
|--------------|--------------|--------------|---------------------------------|---------------------------------|
| vllm         | /rerank      | documents    | results[].relevance_score       | usage.prompt_tokens             |
| vllm-score   | /score       | documents    | data[].score                    | usage.prompt_tokens             |
| tei          | /rerank      | texts        | bare list [].score              | x-compute-tokens header         |
| infinity     | /rerank      | documents    | results[].relevance_score       | usage.prompt_tokens             |
| cohere       | /v2/rerank   | documents    | results[].relevance_score       | meta.tokens / meta.billed_units |
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import httpx
import msgspec

from adapters.base import EngineError

__all__ = ("PROTOCOLS", "UpstreamCall", "WireProtocol", "make_protocol")

_encoder = msgspec.json.Encoder()


class UpstreamCall(msgspec.Struct, frozen=True):
    query: str
    instruction: str
    texts: Sequence[str]
    max_tokens_per_doc: int | None = None


class _Indexed(msgspec.Struct):
    index: int
    relevance_score: float | None = None
    score: float | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    total_tokens: int | None = None


class _Tokens(msgspec.Struct):
    input_tokens: float | None = None


class _Meta(msgspec.Struct):
    tokens: _Tokens | None = None
    billed_units: _Tokens | None = None


class _Ranked(msgspec.Struct):
    # vllm /rerank, infinity, cohere (documents, if echoed anyway, are ignored).
    results: list[_Indexed]
    usage: _Usage | None = None
    meta: _Meta | None = None


class _Scored(msgspec.Struct):
    # vllm /score
    data: list[_Indexed]
    usage: _Usage | None = None


def estimate_tokens(call: UpstreamCall) -> int:
    """For upstreams that report no usage: ~4 UTF-8 bytes per token, query repeated per text."""
    query = len(call.query.encode()) // 4 + 1
    return sum(query + len(t.encode()) // 4 + 1 for t in call.texts)


class WireProtocol(abc.ABC):
    """One upstream API: how to ask it for scores and how to read its answer."""

    name: ClassVar[str]
    path: ClassVar[str]
    # Most texts one call may carry (None: no limit of its own).
    default_max_batch: ClassVar[int | None] = None
    # Whether the API has an instruction field at all.
    takes_instruction: ClassVar[bool] = False

    def __init__(self, *, model: str | None, forward_instruction: bool) -> None:
        self.model = model
        self.forward_instruction = forward_instruction and self.takes_instruction

    def encode(self, call: UpstreamCall) -> bytes:
        return _encoder.encode(self.body(call))

    @abc.abstractmethod
    def body(self, call: UpstreamCall) -> dict[str, Any]:
        ...

    @abc.abstractmethod
    def decode(self, content: bytes, headers: httpx.Headers, call: UpstreamCall) -> tuple[list[float], int]:
        ...

    def _common(self, body: dict[str, Any], call: UpstreamCall) -> dict[str, Any]:
        if self.model:
            body["model"] = self.model
        if self.forward_instruction and call.instruction:
            body["instruction"] = call.instruction
        return body


def _in_order(items: Sequence[_Indexed], size: int, upstream: str) -> list[float]:
    """Scores by the upstream's indices; every text must have exactly one."""
    scores = [math.nan] * size
    for item in items:
        value = item.relevance_score if item.relevance_score is not None else item.score
        if value is None or not 0 <= item.index < size:
            raise EngineError(f"{upstream} returned a result without a score or with index {item.index}")
        scores[item.index] = value
    if len(items) != size or any(math.isnan(s) for s in scores):
        raise EngineError(f"{upstream} returned {len(items)} scores for {size} texts")
    return scores


def _decode(content: bytes, type_: type[Any], upstream: str) -> Any:
    try:
        return msgspec.json.decode(content, type=type_)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EngineError(f"{upstream} returned a malformed response: {str(exc)[:200]}") from None


def _usage_tokens(usage: _Usage | None, call: UpstreamCall) -> int:
    if usage is not None:
        for value in (usage.prompt_tokens, usage.total_tokens):
            if value is not None:
                return value
    return estimate_tokens(call)


class VllmRerank(WireProtocol):
    name, path, takes_instruction = "vllm", "/rerank", True

    def body(self, call: UpstreamCall) -> dict[str, Any]:
        # top_n 0 would mean "all" too, but an explicit count reads the same on every version.
        body: dict[str, Any] = {"query": call.query, "documents": list(call.texts), "top_n": len(call.texts)}
        if call.max_tokens_per_doc:
            body["max_tokens_per_doc"] = call.max_tokens_per_doc
        return self._common(body, call)

    def decode(self, content: bytes, headers: httpx.Headers, call: UpstreamCall) -> tuple[list[float], int]:
        ranked = _decode(content, _Ranked, self.name)
        return _in_order(ranked.results, len(call.texts), self.name), _usage_tokens(ranked.usage, call)


class VllmScore(WireProtocol):
    name, path, takes_instruction = "vllm-score", "/score", True

    def body(self, call: UpstreamCall) -> dict[str, Any]:
        body: dict[str, Any] = {"queries": call.query, "documents": list(call.texts)}
        if call.max_tokens_per_doc:
            body["max_tokens_per_doc"] = call.max_tokens_per_doc
        return self._common(body, call)

    def decode(self, content: bytes, headers: httpx.Headers, call: UpstreamCall) -> tuple[list[float], int]:
        scored = _decode(content, _Scored, self.name)
        return _in_order(scored.data, len(call.texts), self.name), _usage_tokens(scored.usage, call)


class TeiRerank(WireProtocol):
    # TEI refuses more than --max-client-batch-size texts (default 32) with 413.
    name, path, default_max_batch = "tei", "/rerank", 32

    def body(self, call: UpstreamCall) -> dict[str, Any]:
        # TEI serves one model per process and has no model or instruction field.
        return {"query": call.query, "texts": list(call.texts), "raw_scores": False, "return_text": False, "truncate": True}

    def decode(self, content: bytes, headers: httpx.Headers, call: UpstreamCall) -> tuple[list[float], int]:
        ranks = _decode(content, list[_Indexed], self.name)
        reported = headers.get("x-compute-tokens")
        tokens = int(reported) if reported and reported.isdigit() else estimate_tokens(call)
        return _in_order(ranks, len(call.texts), self.name), tokens


class InfinityRerank(WireProtocol):
    name, path = "infinity", "/rerank"

    def body(self, call: UpstreamCall) -> dict[str, Any]:
        body = {
            "query": call.query,
            "documents": list(call.texts),
            "top_n": len(call.texts),
            "return_documents": False,
            "raw_scores": False,
        }
        return self._common(body, call)

    def decode(self, content: bytes, headers: httpx.Headers, call: UpstreamCall) -> tuple[list[float], int]:
        ranked = _decode(content, _Ranked, self.name)
        return _in_order(ranked.results, len(call.texts), self.name), _usage_tokens(ranked.usage, call)


class CohereRerank(VllmRerank):
    # Also another rerank-gateway (gateway -> gateway chaining), which accepts `instruction`.
    # The request body is vLLM's /rerank body (vLLM follows Cohere v2 there); the usage differs.
    name, path, takes_instruction = "cohere", "/v2/rerank", True

    def decode(self, content: bytes, headers: httpx.Headers, call: UpstreamCall) -> tuple[list[float], int]:
        ranked = _decode(content, _Ranked, self.name)
        tokens = None
        if ranked.meta is not None:
            for part in (ranked.meta.tokens, ranked.meta.billed_units):
                if part is not None and part.input_tokens is not None:
                    tokens = int(part.input_tokens)
                    break
        if tokens is None:
            tokens = _usage_tokens(ranked.usage, call)
        return _in_order(ranked.results, len(call.texts), self.name), tokens


PROTOCOLS: dict[str, type[WireProtocol]] = {
    cls.name: cls for cls in (VllmRerank, VllmScore, TeiRerank, InfinityRerank, CohereRerank)
}


def make_protocol(name: str, *, model: str | None, forward_instruction: bool) -> WireProtocol:
    return PROTOCOLS[name](model=model, forward_instruction=forward_instruction)
