"""What differs between the hosted rerank APIs, one table row each: the request body, how the answer
is read, and what each documented status means (docs/upstreams.md names the source of every row).

Everything else -- keys, splitting, retries, the HTTP client -- is the same for all of them and
lives in :mod:`adapters.upstreams.hosted.engine` (and :mod:`adapters.upstreams.api`, which it extends).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from adapters.base import ScoreJob
from schemas.config import (
    CohereEngineConfig,
    HostedRerankConfig,
    JinaEngineConfig,
    MixedbreadEngineConfig,
    NvidiaEngineConfig,
    TogetherEngineConfig,
    VoyageEngineConfig,
)

__all__ = ("PROVIDERS", "Outcome", "Parsed", "Provider")


class Outcome(enum.Enum):
    """What an upstream status means for the client (the classes of :mod:`adapters.base`)."""

    INPUT = "input"  # the request itself was refused: 422 with the provider's message, never retried
    ACCOUNT = "account"  # the gateway's key or account (401, 402, 403): 502, details only in the log
    MISCONFIGURED = "misconfigured"  # the configured model or path does not exist there (404): 502 saying so
    RETRY = "retry"  # rate limit or a transient fault the provider's docs say to retry: then 503
    FAIL = "fail"  # a fault not worth retrying: 502


# (index, score) per result, and the tokens the provider reports (None: unsaid).
Parsed = tuple[list[tuple[int, float]], int | None]

# Statuses every provider shares: a timeout of the request (408) is worth another try, 413 is a body too large.
_COMMON = {
    400: Outcome.INPUT,
    401: Outcome.ACCOUNT,
    403: Outcome.ACCOUNT,
    404: Outcome.MISCONFIGURED,
    408: Outcome.RETRY,
    413: Outcome.INPUT,
    422: Outcome.INPUT,
    429: Outcome.RETRY,
    502: Outcome.RETRY,
    503: Outcome.RETRY,
    504: Outcome.RETRY,
}


@dataclass(frozen=True)
class Provider:
    name: str  # for messages and logs: "Cohere", "Voyage AI", ...
    body: Callable[[HostedRerankConfig, ScoreJob, Sequence[str]], dict[str, object]]
    parse: Callable[[bytes], Parsed]  # raises msgspec.DecodeError / ValidationError on a malformed answer
    statuses: dict[int, Outcome]  # anything else: FAIL
    # The provider's score is a logit (NVIDIA): the score is its sigmoid, the raw score the logit itself.
    logits: bool = False

    def outcome(self, status: int) -> Outcome:
        return self.statuses.get(status, Outcome.FAIL)


# -- answers ---------------------------------------------------------------------------------------
class _Result(msgspec.Struct):
    index: int
    relevance_score: float


class _Usage(msgspec.Struct):
    total_tokens: int | None = None
    prompt_tokens: int | None = None

    def tokens(self) -> int | None:
        for value in (self.total_tokens, self.prompt_tokens):
            if value is not None and value >= 0:
                return value
        return None


class _Tokens(msgspec.Struct):
    input_tokens: float | None = None


class _CohereMeta(msgspec.Struct):
    tokens: _Tokens | None = None
    billed_units: _Tokens | None = None


class _CohereAnswer(msgspec.Struct):
    results: list[_Result]
    meta: _CohereMeta | None = None


class _ResultsAnswer(msgspec.Struct):  # Jina, Together
    results: list[_Result]
    usage: _Usage | None = None


class _VoyageAnswer(msgspec.Struct):
    data: list[_Result]
    usage: _Usage | None = None


class _MixedbreadResult(msgspec.Struct):
    index: int
    score: float


class _MixedbreadAnswer(msgspec.Struct):
    data: list[_MixedbreadResult]
    usage: _Usage | None = None


class _Ranking(msgspec.Struct):
    index: int
    logit: float


class _NvidiaAnswer(msgspec.Struct):
    rankings: list[_Ranking]
    usage: _Usage | None = None


_cohere = msgspec.json.Decoder(_CohereAnswer)
_results = msgspec.json.Decoder(_ResultsAnswer)
_voyage = msgspec.json.Decoder(_VoyageAnswer)
_mixedbread = msgspec.json.Decoder(_MixedbreadAnswer)
_nvidia = msgspec.json.Decoder(_NvidiaAnswer)


def _parse_cohere(body: bytes) -> Parsed:
    answer = _cohere.decode(body)
    tokens = None
    for part in (answer.meta.tokens, answer.meta.billed_units) if answer.meta else ():
        if (
            part is not None
            and part.input_tokens is not None
            and math.isfinite(part.input_tokens)
            and part.input_tokens >= 0
        ):
            tokens = int(part.input_tokens)
            break
    return [(r.index, r.relevance_score) for r in answer.results], tokens


def _parse_results(body: bytes) -> Parsed:
    answer = _results.decode(body)
    return [(r.index, r.relevance_score) for r in answer.results], answer.usage.tokens() if answer.usage else None


def _parse_voyage(body: bytes) -> Parsed:
    answer = _voyage.decode(body)
    return [(r.index, r.relevance_score) for r in answer.data], answer.usage.tokens() if answer.usage else None


def _parse_mixedbread(body: bytes) -> Parsed:
    answer = _mixedbread.decode(body)
    return [(r.index, r.score) for r in answer.data], answer.usage.tokens() if answer.usage else None


def _parse_nvidia(body: bytes) -> Parsed:
    answer = _nvidia.decode(body)
    return [(r.index, r.logit) for r in answer.rankings], answer.usage.tokens() if answer.usage else None


# -- requests --------------------------------------------------------------------------------------
# Every body asks for all scores and no documents back: ordering, top_n and echo are the gateway's.
def _cohere_body(cfg: HostedRerankConfig, job: ScoreJob, texts: Sequence[str]) -> dict[str, object]:
    assert isinstance(cfg, CohereEngineConfig)
    limit = (
        cfg.max_tokens_per_doc
        if job.max_tokens_per_doc is None
        else min(job.max_tokens_per_doc, cfg.max_tokens_per_doc)
    )
    body: dict[str, object] = {
        "model": cfg.model,
        "query": job.query,
        "documents": list(texts),
        "top_n": len(texts),
        "max_tokens_per_doc": limit,
    }
    if cfg.priority is not None:
        body["priority"] = cfg.priority
    return body


def _jina_body(cfg: HostedRerankConfig, job: ScoreJob, texts: Sequence[str]) -> dict[str, object]:
    return {
        "model": cfg.model,
        "query": job.query,
        "documents": list(texts),
        "top_n": len(texts),
        "return_documents": False,
    }


def _voyage_body(cfg: HostedRerankConfig, job: ScoreJob, texts: Sequence[str]) -> dict[str, object]:
    assert isinstance(cfg, VoyageEngineConfig)
    return {
        "model": cfg.model,
        "query": job.query,
        "documents": list(texts),
        "top_k": len(texts),
        "return_documents": False,
        "truncation": cfg.truncation,
    }


def _mixedbread_body(cfg: HostedRerankConfig, job: ScoreJob, texts: Sequence[str]) -> dict[str, object]:
    return {"model": cfg.model, "query": job.query, "input": list(texts), "top_k": len(texts), "return_input": False}


def _nvidia_body(cfg: HostedRerankConfig, job: ScoreJob, texts: Sequence[str]) -> dict[str, object]:
    assert isinstance(cfg, NvidiaEngineConfig)
    return {
        "model": cfg.model,
        "query": {"text": job.query},
        "passages": [{"text": t} for t in texts],
        "truncate": cfg.truncate,
    }


def _together_body(cfg: HostedRerankConfig, job: ScoreJob, texts: Sequence[str]) -> dict[str, object]:
    return {
        "model": cfg.model,
        "query": job.query,
        "documents": list(texts),
        "top_n": len(texts),
        "return_documents": False,
    }


PROVIDERS: dict[type[HostedRerankConfig], Provider] = {
    # Cohere's SDK retries 429 and 5xx; 402 is billing, 498 a deny-listed token in the request, 501 not implemented.
    CohereEngineConfig: Provider(
        "Cohere", _cohere_body, _parse_cohere, {**_COMMON, 402: Outcome.ACCOUNT, 498: Outcome.INPUT, 500: Outcome.RETRY}
    ),
    # Jina documents no error table: the common one, 402 for an exhausted balance; a 500 is not retried.
    JinaEngineConfig: Provider("Jina AI", _jina_body, _parse_results, {**_COMMON, 402: Outcome.ACCOUNT}),
    # Voyage's error page: 403 is a forbidden IP (the gateway's), 500 and 502-504 "retry after a brief wait".
    VoyageEngineConfig: Provider("Voyage AI", _voyage_body, _parse_voyage, {**_COMMON, 500: Outcome.RETRY}),
    # Mixedbread's SDK retries 408, 409, 429 and 5xx; 402 is an exhausted balance.
    MixedbreadEngineConfig: Provider(
        "Mixedbread",
        _mixedbread_body,
        _parse_mixedbread,
        {**_COMMON, 402: Outcome.ACCOUNT, 409: Outcome.RETRY, 500: Outcome.RETRY},
    ),
    # NIM: 422 for a request it cannot take (a pair over the window with truncate NONE); 500 not retried.
    NvidiaEngineConfig: Provider("NVIDIA", _nvidia_body, _parse_nvidia, {**_COMMON, 402: Outcome.ACCOUNT}, logits=True),
    # Together's error table: 402 spending limit, 403 over the model's context (the input), 500 / 503 "try again".
    TogetherEngineConfig: Provider(
        "Together",
        _together_body,
        _parse_results,
        {**_COMMON, 402: Outcome.ACCOUNT, 403: Outcome.INPUT, 500: Outcome.RETRY},
    ),
}
