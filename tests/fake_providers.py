"""Hosted rerank APIs for tests -- Cohere, Jina AI, Voyage AI, Mixedbread, NVIDIA, Together --
written from their published references (docs/upstreams.md), one table row per provider.

One real HTTP/1.1 server on 127.0.0.1 and a free port (tests/fake_http.py) serves all of them,
each under its own prefix: ``{url}/cohere`` is Cohere's base URL, so Cohere's call is
``POST /cohere/v2/rerank``. Each provider is strict the way it is:

- the ``Authorization: Bearer <key>`` header (401 in the provider's own error envelope otherwise,
  quoting the key it got, as some APIs do, so a test can check the gateway never repeats it);
- the body's field names (an unknown one is a 400/422, as on Cohere v2), their types, the
  required ones;
- the documented limits: documents per call, and Voyage's tokens per call counted as
  query tokens x documents + document tokens (a 400, as the provider answers);
- answers in the provider's shape (``results`` / ``data`` / ``rankings``, best first), with
  its usage field.

Tests script faults for the next calls: any status (with headers: 429 + Retry-After), a
malformed body, a slow or hanging answer.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fake_http import Answer, FakeUpstream


def fake_score(query: str, document: str) -> float:
    """The fake model: a deterministic score in (0, 1) per (query, document)."""
    digest = hashlib.sha256(f"{query}\x00{document}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") + 1) / (2**64 + 2)


def fake_tokens(text: str) -> int:
    """The fake tokenizer's count: ~4 UTF-8 bytes per token, like a real BPE on English."""
    return len(text.encode()) // 4 + 1


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _need(body: dict[str, Any], name: str, kind: type | tuple[type, ...], status: int) -> Any:
    value = body.get(name)
    if name not in body:
        raise Refused(status, f"missing required field '{name}'")
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise Refused(status, f"field '{name}' has the wrong type")
    return value


def _strings(value: Any, name: str, status: int) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise Refused(status, f"'{name}' must be a non-empty list of strings")
    return value


@dataclass(frozen=True)
class Spec:
    """One provider: its path, its request schema and how it answers and fails."""

    path: str
    fields: frozenset[str]  # every field the provider accepts
    invalid: int  # the status of a request it cannot take (400 or 422)
    read: Callable[[dict[str, Any], int], tuple[str, list[str]]]  # (query, documents), validated
    answer: Callable[[str, list[tuple[int, float]], int], dict[str, Any]]  # ranked results, tokens
    error: Callable[[int, str], dict[str, Any]]  # the provider's error envelope


def _top(body: dict[str, Any], name: str, documents: int, status: int) -> None:
    if name in body:
        value = _need(body, name, int, status)
        if not 1 <= value <= documents:
            raise Refused(status, f"'{name}' must be between 1 and the number of documents")


def _read_cohere(body: dict[str, Any], status: int) -> tuple[str, list[str]]:
    _need(body, "model", str, status)
    query = _need(body, "query", str, status)
    documents = _strings(body.get("documents"), "documents", status)
    _top(body, "top_n", len(documents), status)
    if "max_tokens_per_doc" in body and not 1 <= _need(body, "max_tokens_per_doc", int, status):
        raise Refused(status, "max_tokens_per_doc must be at least 1")
    if "priority" in body and not 0 <= _need(body, "priority", int, status) <= 999:
        raise Refused(status, "priority must be between 0 and 999")
    return query, documents


def _read_docs(top: str, docs: str, echo: str) -> Callable[[dict[str, Any], int], tuple[str, list[str]]]:
    def read(body: dict[str, Any], status: int) -> tuple[str, list[str]]:
        _need(body, "model", str, status)
        query = _need(body, "query", str, status)
        documents = _strings(body.get(docs), docs, status)
        _top(body, top, len(documents), status)
        for flag in (echo, "truncation"):
            if flag in body:
                _need(body, flag, bool, status)
        return query, documents

    return read


def _read_nvidia(body: dict[str, Any], status: int) -> tuple[str, list[str]]:
    _need(body, "model", str, status)
    query = _need(body, "query", dict, status)
    passages = _need(body, "passages", list, status)
    if set(query) != {"text"} or not isinstance(query["text"], str):
        raise Refused(status, "query must be {'text': string}")
    if not passages or not all(
        isinstance(p, dict) and set(p) == {"text"} and isinstance(p["text"], str) for p in passages
    ):
        raise Refused(status, "passages must be a non-empty list of {'text': string}")
    if body.get("truncate", "END") not in ("NONE", "END"):
        raise Refused(status, "truncate must be NONE or END")
    return query["text"], [p["text"] for p in passages]


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


SPECS: dict[str, Spec] = {
    "cohere": Spec(
        "/v2/rerank",
        frozenset({"model", "query", "documents", "top_n", "max_tokens_per_doc", "priority"}),
        400,
        _read_cohere,
        lambda rid, ranked, tokens: {
            "id": rid,
            "results": [{"index": i, "relevance_score": s} for i, s in ranked],
            "meta": {
                "api_version": {"version": "2"},
                "billed_units": {"search_units": 1},
                "tokens": {"input_tokens": tokens},
            },
        },
        lambda status, message: {"id": "err", "message": message},
    ),
    "jina": Spec(
        "/v1/rerank",
        frozenset({"model", "query", "documents", "top_n", "return_documents"}),
        422,
        _read_docs("top_n", "documents", "return_documents"),
        lambda rid, ranked, tokens: {
            "model": "m",
            "usage": {"total_tokens": tokens},
            "results": [{"index": i, "relevance_score": s} for i, s in ranked],
        },
        lambda status, message: {"detail": message},
    ),
    "voyage": Spec(
        "/v1/rerank",
        frozenset({"model", "query", "documents", "top_k", "return_documents", "truncation"}),
        400,
        _read_docs("top_k", "documents", "return_documents"),
        lambda rid, ranked, tokens: {
            "object": "list",
            "model": "m",
            "usage": {"total_tokens": tokens},
            "data": [{"index": i, "relevance_score": s} for i, s in ranked],
        },
        lambda status, message: {"detail": message},
    ),
    "mixedbread": Spec(
        "/v1/reranking",
        frozenset({"model", "query", "input", "top_k", "return_input", "rank_fields"}),
        422,
        _read_docs("top_k", "input", "return_input"),
        lambda rid, ranked, tokens: {
            "object": "list",
            "model": "m",
            "top_k": len(ranked),
            "return_input": False,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "data": [{"index": i, "score": s, "object": "rank_result"} for i, s in ranked],
        },
        lambda status, message: {"error": {"message": message, "type": "invalid_request_error"}},
    ),
    "nvidia": Spec(
        "/v1/ranking",
        frozenset({"model", "query", "passages", "truncate"}),
        422,
        _read_nvidia,
        lambda rid, ranked, tokens: {"rankings": [{"index": i, "logit": _logit(s)} for i, s in ranked]},
        lambda status, message: {"type": "about:blank", "title": "Error", "status": status, "detail": message},
    ),
    "together": Spec(
        "/v1/rerank",
        frozenset({"model", "query", "documents", "top_n", "return_documents", "rank_fields"}),
        400,
        _read_docs("top_n", "documents", "return_documents"),
        lambda rid, ranked, tokens: {
            "object": "rerank",
            "id": rid,
            "model": "m",
            "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
            "results": [{"index": i, "relevance_score": s, "document": None} for i, s in ranked],
        },
        lambda status, message: {"error": {"message": message, "type": "invalid_request_error", "code": status}},
    ),
}


@dataclass
class Fault:
    """What to answer instead of a normal response (after ``delay_s``)."""

    status: int | None = None  # None: 500, or 200 with ``raw``
    message: str = "internal error, please try again later"
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # a body sent as is (e.g. malformed JSON)
    delay_s: float = 0.0


@dataclass
class Recorded:
    provider: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float  # time.monotonic() on arrival


@dataclass
class Limits:
    max_documents: int = 1000
    max_request_tokens: int | None = None  # query tokens x documents + document tokens (Voyage's rule)


class FakeProviders(FakeUpstream[Fault]):
    """``with FakeProviders(keys) as fake: fake.base_url("cohere")`` -- served while the block runs."""

    def __init__(self, keys: dict[str, str], limits: dict[str, Limits] | None = None) -> None:
        self.keys = keys
        self.limits = {name: (limits or {}).get(name, Limits()) for name in SPECS}
        self.requests: list[Recorded] = []
        super().__init__(self.requests, queues=SPECS)

    def base_url(self, provider: str) -> str:
        return f"{self.url}/{provider}"

    def fail_next(self, provider: str, *faults: Fault) -> None:
        self._script(provider, faults)

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        provider, _, rest = path.lstrip("/").partition("/")
        spec = SPECS.get(provider)
        if spec is None or "/" + rest != spec.path:
            return 404, {}, b'{"message": "not found"}'

        def error(status: int, message: str, extra: dict[str, str] | None = None) -> Answer:
            return status, extra or {}, json.dumps(spec.error(status, message)).encode()

        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or token != self.keys[provider]:
            return error(401, f"invalid api token: {token}")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return error(spec.invalid, "the request body is not a JSON object")
        fault = self._arrived(Recorded(provider, headers, body, time.monotonic()), provider)
        if fault is not None:
            if self._held(fault.delay_s):
                return 503, {}, b""
            if fault.raw is not None:
                return fault.status or 200, fault.headers, fault.raw
            return error(fault.status or 500, fault.message, fault.headers)
        try:
            unknown = set(body) - spec.fields
            if unknown:
                raise Refused(spec.invalid, f"unknown field '{min(unknown)}'")
            query, documents = spec.read(body, spec.invalid)
            limits = self.limits[provider]
            if len(documents) > limits.max_documents:
                raise Refused(spec.invalid, f"too many documents: {len(documents)} > {limits.max_documents}")
            tokens = fake_tokens(query) * len(documents) + sum(map(fake_tokens, documents))
            if limits.max_request_tokens is not None and tokens > limits.max_request_tokens:
                raise Refused(spec.invalid, f"total tokens {tokens} exceed the limit {limits.max_request_tokens}")
        except Refused as exc:
            return error(exc.status, exc.message)
        ranked = sorted(((i, fake_score(query, d)) for i, d in enumerate(documents)), key=lambda r: -r[1])
        return 200, {}, json.dumps(spec.answer("rid", ranked, tokens)).encode()
