"""Request and response mapping for the rerank servers a pool can forward to.

Each protocol turns one :class:`UpstreamCall` (a query and its texts) into the upstream's
request body, and its answer back into one score per text, in the texts' order, plus the
tokens it reports. We ask for no documents echoed and activated (0..1) scores: ordering and
echo are the gateway's job. ``top_n`` is forwarded only when the call carries one (the pool sets
it when one call holds the whole job and the job allows it, see ``ScoreJob.top_n``), for the
protocols whose API ranks (``supports_top_n``); the answer then names its items by index.
Answers are decoded into structs holding only the fields read (ids, echoed documents and the
rest are skipped by msgspec without building objects).

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
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import msgspec

from adapters.base import EngineError

__all__ = ("PROTOCOLS", "UpstreamAnswer", "UpstreamCall", "WireProtocol", "make_protocol")

_encoder = msgspec.json.Encoder()


class UpstreamCall(msgspec.Struct, frozen=True):
    query: str
    instruction: str
    texts: Sequence[str]
    max_tokens_per_doc: int | None = None
    # Ask the upstream for only the best top_n (None: every score, in order).
    top_n: int | None = None


class UpstreamAnswer(msgspec.Struct, frozen=True):
    """Scores of one call: every text's in order (``indices`` None), or the best ``top_n``'s."""

    scores: list[float]
    tokens: int
    indices: list[int] | None = None


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
    # vllm /rerank, infinity (documents, if echoed anyway, are skipped).
    results: list[_Indexed]
    usage: _Usage | None = None


class _CohereRanked(msgspec.Struct):
    # cohere /v2/rerank: id and echoed documents skipped; usage for servers that send vLLM's.
    results: list[_Indexed]
    meta: _Meta | None = None
    usage: _Usage | None = None


class _Scored(msgspec.Struct):
    # vllm /score
    data: list[_Indexed]
    usage: _Usage | None = None


def estimate_tokens(call: UpstreamCall, body_bytes: int) -> int:
    """For upstreams that report no usage: ~4 bytes per token, the query repeated per text.

    The texts' size is read off the encoded request body (the texts are nearly all of it),
    so the estimate costs no second pass over the documents.
    """
    query = len(call.query) // 4 + 1
    return len(call.texts) * (query + 1) + max(0, body_bytes - len(call.query)) // 4


class WireProtocol(abc.ABC):
    """One upstream API: how to ask it for scores and how to read its answer."""

    name: ClassVar[str]
    path: ClassVar[str]
    # Most texts one call may carry (None: no limit of its own).
    default_max_batch: ClassVar[int | None] = None
    # Whether the API has an instruction field at all.
    takes_instruction: ClassVar[bool] = False
    # Whether the API can return only the best top_n results, by index.
    supports_top_n: ClassVar[bool] = False

    def __init__(self, *, model: str | None, forward_instruction: bool) -> None:
        self.model = model
        self.forward_instruction = forward_instruction and self.takes_instruction

    def encode(self, call: UpstreamCall) -> bytes:
        return _encoder.encode(self.body(call))

    @abc.abstractmethod
    def body(self, call: UpstreamCall) -> dict[str, Any]: ...

    @abc.abstractmethod
    def decode(self, content: bytes, headers: Mapping[str, str], call: UpstreamCall, body_bytes: int) -> UpstreamAnswer:
        """The answer to ``call``, whose encoded body was ``body_bytes`` long (for estimates)."""
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


def _best(items: Sequence[_Indexed], size: int, top_n: int, upstream: str) -> tuple[list[int], list[float]]:
    """(indices, scores) of a top_n answer: min(top_n, size) distinct, in-range indices."""
    indices, scores = [], []
    for item in items:
        value = item.relevance_score if item.relevance_score is not None else item.score
        if value is None or not 0 <= item.index < size:
            raise EngineError(f"{upstream} returned a result without a score or with index {item.index}")
        indices.append(item.index)
        scores.append(value)
    if len(items) != min(top_n, size) or len(set(indices)) != len(indices):
        raise EngineError(f"{upstream} returned {len(items)} results (distinct: {len(set(indices))}) for top_n {top_n}")
    return indices, scores


def _answer(items: Sequence[_Indexed], tokens: int, call: UpstreamCall, upstream: str) -> UpstreamAnswer:
    if call.top_n is not None:
        indices, scores = _best(items, len(call.texts), call.top_n, upstream)
        return UpstreamAnswer(scores, tokens, indices)
    return UpstreamAnswer(_in_order(items, len(call.texts), upstream), tokens)


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _decode(content: bytes, type_: type[Any], upstream: str) -> Any:
    decoder = _DECODERS.get(type_)
    if decoder is None:
        decoder = _DECODERS[type_] = msgspec.json.Decoder(type_)
    try:
        return decoder.decode(content)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EngineError(f"{upstream} returned a malformed response: {str(exc)[:200]}") from None


def _usage_tokens(usage: _Usage | None, call: UpstreamCall, body_bytes: int) -> int:
    if usage is not None:
        for value in (usage.prompt_tokens, usage.total_tokens):
            if value is not None and value >= 0:  # a negative count is no count (it would break the metrics)
                return value
    return estimate_tokens(call, body_bytes)


class VllmRerank(WireProtocol):
    name, path, takes_instruction, supports_top_n = "vllm", "/rerank", True, True

    def body(self, call: UpstreamCall) -> dict[str, Any]:
        # top_n 0 would mean "all" too, but an explicit count reads the same on every version.
        top_n = call.top_n if call.top_n is not None else len(call.texts)
        body: dict[str, Any] = {"query": call.query, "documents": call.texts, "top_n": top_n}
        if call.max_tokens_per_doc:
            body["max_tokens_per_doc"] = call.max_tokens_per_doc
        return self._common(body, call)

    def decode(self, content: bytes, headers: Mapping[str, str], call: UpstreamCall, body_bytes: int) -> UpstreamAnswer:
        ranked = _decode(content, _Ranked, self.name)
        return _answer(ranked.results, _usage_tokens(ranked.usage, call, body_bytes), call, self.name)


class VllmScore(WireProtocol):
    name, path, takes_instruction = "vllm-score", "/score", True

    def body(self, call: UpstreamCall) -> dict[str, Any]:
        body: dict[str, Any] = {"queries": call.query, "documents": call.texts}
        if call.max_tokens_per_doc:
            body["max_tokens_per_doc"] = call.max_tokens_per_doc
        return self._common(body, call)

    def decode(self, content: bytes, headers: Mapping[str, str], call: UpstreamCall, body_bytes: int) -> UpstreamAnswer:
        scored = _decode(content, _Scored, self.name)
        return UpstreamAnswer(
            _in_order(scored.data, len(call.texts), self.name), _usage_tokens(scored.usage, call, body_bytes)
        )


class TeiRerank(WireProtocol):
    # TEI refuses more than --max-client-batch-size texts (default 32) with 413.
    name, path, default_max_batch = "tei", "/rerank", 32

    def body(self, call: UpstreamCall) -> dict[str, Any]:
        # TEI serves one model per process and has no model or instruction field.
        return {"query": call.query, "texts": call.texts, "raw_scores": False, "return_text": False, "truncate": True}

    def decode(self, content: bytes, headers: Mapping[str, str], call: UpstreamCall, body_bytes: int) -> UpstreamAnswer:
        ranks = _decode(content, list[_Indexed], self.name)
        reported = headers.get("x-compute-tokens")
        # ASCII digits, and few enough for int() (a header of thousands of digits made it raise).
        ok = reported is not None and 0 < len(reported) <= 18 and reported.isascii() and reported.isdigit()
        tokens = int(reported) if ok else estimate_tokens(call, body_bytes)
        return UpstreamAnswer(_in_order(ranks, len(call.texts), self.name), tokens)


class InfinityRerank(WireProtocol):
    name, path, supports_top_n = "infinity", "/rerank", True

    def body(self, call: UpstreamCall) -> dict[str, Any]:
        body = {
            "query": call.query,
            "documents": call.texts,
            "top_n": call.top_n if call.top_n is not None else len(call.texts),
            "return_documents": False,
            "raw_scores": False,
        }
        return self._common(body, call)

    def decode(self, content: bytes, headers: Mapping[str, str], call: UpstreamCall, body_bytes: int) -> UpstreamAnswer:
        ranked = _decode(content, _Ranked, self.name)
        return _answer(ranked.results, _usage_tokens(ranked.usage, call, body_bytes), call, self.name)


class CohereRerank(VllmRerank):
    # Also another rerank-gateway (gateway -> gateway chaining), which accepts `instruction`.
    # The request body is vLLM's /rerank body (vLLM follows Cohere v2 there); the usage differs.
    name, path, takes_instruction = "cohere", "/v2/rerank", True

    def decode(self, content: bytes, headers: Mapping[str, str], call: UpstreamCall, body_bytes: int) -> UpstreamAnswer:
        ranked = _decode(content, _CohereRanked, self.name)
        tokens = None
        if ranked.meta is not None:
            for part in (ranked.meta.tokens, ranked.meta.billed_units):
                if part is not None and part.input_tokens is not None and part.input_tokens >= 0:
                    tokens = int(part.input_tokens)
                    break
        if tokens is None:
            tokens = _usage_tokens(ranked.usage, call, body_bytes)
        return _answer(ranked.results, tokens, call, self.name)


PROTOCOLS: dict[str, type[WireProtocol]] = {
    cls.name: cls for cls in (VllmRerank, VllmScore, TeiRerank, InfinityRerank, CohereRerank)
}


def make_protocol(name: str, *, model: str | None, forward_instruction: bool) -> WireProtocol:
    return PROTOCOLS[name](model=model, forward_instruction=forward_instruction)
