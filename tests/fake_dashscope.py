"""A DashScope text-rerank server for tests, written from the documented protocol.

It is a real HTTP/1.1 server on 127.0.0.1 and a free port (tests/fake_http.py), serving both
endpoints:

- native ``POST /api/v1/services/rerank/text-rerank/text-rerank``:
  ``{model, input: {query, documents}, parameters: {top_n, return_documents, instruct}}`` ->
  ``{output: {results: [{index, relevance_score, document?}]}, usage: {total_tokens}, request_id}``
- compatible ``POST /compatible-api/v1/reranks``:
  ``{model, query, documents, top_n, instruct}`` -> ``{id, results, usage: {total_tokens}}``

Errors use DashScope's envelope ``{code, message, request_id}``. It enforces its limits the
way DashScope does (documents per call, tokens per request -> 400 InvalidParameter) and checks
the Bearer key (401 InvalidApiKey). Tests script faults for the next requests: any status with
headers (429 + Retry-After, 5xx), malformed bodies and slow answers.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.fake_http import Answer, FakeUpstream

NATIVE_PATH = "/api/v1/services/rerank/text-rerank/text-rerank"
COMPATIBLE_PATH = "/compatible-api/v1/reranks"


def fake_score(query: str, document: str, instruct: str | None = None) -> float:
    """The fake model: a deterministic score in [0, 1) per (instruct, query, document)."""
    digest = hashlib.sha256(f"{instruct or ''}\x00{query}\x00{document}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def fake_tokens(text: str) -> int:
    """The fake tokenizer's count: ~4 UTF-8 bytes per token, like a real BPE on English."""
    return len(text.encode()) // 4 + 1


@dataclass
class Fault:
    """What to answer instead of a normal response (after ``delay_s``)."""

    status: int | None = None  # None: 500, or 200 with ``raw``
    code: str = "InternalError"
    message: str = "An internal error has occured, please try again later."
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # a body sent as is (e.g. malformed JSON), with status 200 by default
    delay_s: float = 0.0


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeDashScope(FakeUpstream[Fault]):
    """``with FakeDashScope() as ds: ds.url`` -- the server runs while the block runs."""

    def __init__(
        self, *, api_key: str = "sk-fake-key", max_documents: int = 500, max_request_tokens: int = 30_000
    ) -> None:
        self.api_key = api_key
        self.max_documents = max_documents
        self.max_request_tokens = max_request_tokens
        self.requests: list[Recorded] = []
        super().__init__(self.requests)

    def fail_next(self, *faults: Fault) -> None:
        """Answer the next len(faults) requests with these faults, in order."""
        self._script("", faults)

    # -- protocol ----------------------------------------------------------------------------
    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        rid = str(uuid.uuid4())
        if path not in (NATIVE_PATH, COMPATIBLE_PATH):
            return _error(404, "NotFound", f"path {path} not found", rid)
        if headers.get("authorization") != f"Bearer {self.api_key}":
            return _error(401, "InvalidApiKey", "Invalid API-key provided.", rid)
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "InvalidParameter", "The request body is not valid JSON.", rid)
        fault = self._arrived(Recorded(path, headers, body))
        if fault is not None:
            if self._held(fault.delay_s):
                return 503, {}, b""
            if fault.raw is not None:
                return fault.status or 200, fault.headers, fault.raw
            status, hdrs, payload = _error(fault.status or 500, fault.code, fault.message, rid)
            return status, {**hdrs, **fault.headers}, payload
        native = path == NATIVE_PATH
        params = (body.get("parameters") or {}) if native else body
        source = (body.get("input") or {}) if native else body
        model, query, documents = body.get("model"), source.get("query"), source.get("documents")
        if not model:
            return _error(400, "BadRequest.EmptyModel", 'Required parameter "model" missing from request.', rid)
        if not isinstance(query, str) or not isinstance(documents, list) or not documents:
            return _error(400, "BadRequest.EmptyInput", "Required input parameter missing from request.", rid)
        if len(documents) > self.max_documents:
            return _error(400, "InvalidParameter", f"Range of documents should be [1, {self.max_documents}]", rid)
        tokens = fake_tokens(query) * len(documents) + sum(fake_tokens(d) for d in documents)
        if tokens > self.max_request_tokens:
            return _error(
                400, "InvalidParameter", f"Input tokens {tokens} exceed the limit {self.max_request_tokens}", rid
            )
        instruct = params.get("instruct")
        top_n = params.get("top_n") or len(documents)
        scored = sorted(
            ({"index": i, "relevance_score": fake_score(query, d, instruct)} for i, d in enumerate(documents)),
            key=lambda r: -r["relevance_score"],
        )[:top_n]
        if params.get("return_documents"):
            for r in scored:
                r["document"] = {"text": documents[r["index"]]}
        usage = {"total_tokens": tokens}
        if native:
            answer = {"output": {"results": scored}, "usage": usage, "request_id": rid}
        else:
            answer = {"id": rid, "results": scored, "usage": usage}
        return 200, {}, json.dumps(answer).encode()


def _error(status: int, code: str, message: str, rid: str) -> Answer:
    return status, {}, json.dumps({"code": code, "message": message, "request_id": rid}).encode()
