"""vLLM's score API: ``POST /score`` and ``/v1/score``, answered as ``vllm serve`` answers.

One side is the query, the other the texts scored against it (``text_1``/``text_2``, or the
newer ``queries``/``documents``, ``queries``/``items``, ``data_1``/``data_2``). vLLM's pairing
rules (``entrypoints/pooling/scoring/utils.py``): one first-side text against N second-side
texts is 1:N; N against N is N pairs (1:1 each); anything else is "Input lengths must be either
1:1, 1:N or N:N". The answer lists one score per pair in pair order (not sorted).

The service scores one query per call, so N:N pairs are grouped by query (identical queries
share a call and so their prompt prefix) and the groups run a few at a time; their tokens add
up in the usage, the rate-limit charge and the log line. ``use_activation: false`` asks for raw
scores. The instruction (Qwen3) is ``instruction``, else ``chat_template_kwargs["instruction"]``
(vLLM's template variable), else ``instruct`` (as on /rerank), else the kwargs' ``instruct``.
Errors use vLLM's body ``{"error": {"message", "type", "param", "code"}}``; vLLM answers
invalid requests with 400, so the gateway's 422 becomes 400 here.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, Final

from litestar import Request, Response, post
from litestar.exceptions import HTTPException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from gateway.errors import InvalidRequestError, PayloadTooLargeError, describe_error
from gateway.http.decoding import StrictBody
from gateway.http.dialects.common import finish
from gateway.http.middleware import request_id
from gateway.security.auth import authorize_model
from gateway.serving.models import ModelRegistry
from gateway.serving.service import RerankOutcome, RerankService
from schemas.config import Settings
from schemas.dialects import (
    VllmErrorBody,
    VllmErrorInfo,
    VllmScoreData,
    VllmScoreRequest,
    VllmScoreResponse,
    VllmUsage,
)
from schemas.rerank import RerankRequest

__all__ = ("score", "vllm_error_response")

VLLM: Final = "vllm"
# Query groups of one N:N request scored at once: enough for the engine to batch them, few
# enough that one request cannot fill the model's max_concurrent_requests by itself.
_GROUPS_AT_ONCE: Final = 4
_PAIRINGS: Final = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))
# Each side's name -> whether it is a first side (the query: non-blank in the schema).
_SIDES: Final = {name: name == first for first, second in _PAIRINGS for name in (first, second)}
# The schema's non-blank pattern ``\S`` as JSON Schema (ECMA-262) reads it: any character but its
# white space and line terminators (Python's own \s differs: U+FEFF, U+001C-U+001F, U+0085).
_NON_BLANK: Final = re.compile("[^\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]")
_TYPES: Final = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def _sides(data: VllmScoreRequest) -> tuple[list[str], list[str]]:
    complete = [(a, b) for a, b in _PAIRINGS if getattr(data, a) is not None and getattr(data, b) is not None]
    if len(complete) != 1:
        names = " | ".join(f"{a}/{b}" for a, b in _PAIRINGS)
        raise InvalidRequestError(f"invalid request: send exactly one pair of sides to score, one of: {names}")
    for name, query in _SIDES.items():  # a side sent beside the pair in use is held to the schema too
        value = getattr(data, name)
        if name not in complete[0] and value is not None and not _side_ok(value, query=query):
            what = "a non-blank query or a non-empty list of them" if query else "a text or a non-empty list"
            raise InvalidRequestError(f"invalid request: `{name}` must be {what} (or left out)")
    first, second = (getattr(data, name) for name in complete[0])
    return ([first] if isinstance(first, str) else list(first)), ([second] if isinstance(second, str) else list(second))


def _side_ok(value: str | list[str], *, query: bool) -> bool:
    """What the OpenAPI schema states of a side (msgspec decodes it without those constraints, so
    that the pair in use answers with vLLM's own messages, in ``_pairs``)."""
    if isinstance(value, str):
        return not query or bool(_NON_BLANK.search(value))
    return bool(value) and (not query or all(_NON_BLANK.search(v) for v in value))


def _template_instruction(data: VllmScoreRequest, name: str) -> str | None:
    """``chat_template_kwargs[name]``: vLLM's template reads the instruction from there too."""
    value = (data.chat_template_kwargs or {}).get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequestError(f"invalid request: chat_template_kwargs.{name} must be a string")
    return value


def _pairs(queries: list[str], texts: list[str]) -> list[str]:
    """The query of each pair (vLLM's 1:1 / 1:N / N:N rules and messages)."""
    if len(queries) > 1 and len(queries) != len(texts):
        raise InvalidRequestError("Input lengths must be either 1:1, 1:N or N:N")
    if not queries:
        raise InvalidRequestError("At least one text element must be given")
    if not texts:
        raise InvalidRequestError("At least one text_pair element must be given")
    return queries * len(texts) if len(queries) == 1 else queries


def vllm_error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[VllmErrorBody]:
    status, message, _, headers = describe_error(request, exc)
    if status == 422:
        status = 400
    # vLLM's own error classes where it has one, else the status phrase, as its HTTP handler does.
    kind = _TYPES.get(status) or HTTPStatus(status).phrase
    body = VllmErrorBody(error=VllmErrorInfo(message=message, type=kind, code=status))
    return Response(body, status_code=status, headers=headers)


@post(
    ["/score", "/v1/score"],
    status_code=200,
    summary="Score pairs (vLLM's score API)",
    tags=["vllm"],
    security=[{"bearer": []}],
    dto=StrictBody[VllmScoreRequest],
    return_dto=None,
    responses={
        status: ResponseSpec(data_container=VllmErrorBody, description=text)
        for status, text in (
            (400, "Invalid request (vLLM answers 400 where the Cohere routes answer 422)"),
            (401, "Missing or unknown API key"),
            (404, "Unknown model"),
            (413, "Too many pairs or too large a body"),
            (429, "Over the key's limits"),
            (503, "Model loading or unavailable"),
        )
    },
    exception_handlers={Exception: vllm_error_response, HTTPException: vllm_error_response},
)
async def score(request: Request[Any, Any, Any], data: JSONBody[VllmScoreRequest]) -> Response[VllmScoreResponse]:
    settings: Settings = request.app.state.settings
    service: RerankService = request.app.state.service
    queries, texts = _sides(data)
    registry: ModelRegistry = request.app.state.registry
    # 404/403 before the pairs are looked at, as on the Cohere routes: a key without the model
    # learns nothing about the limits.
    runtime = registry.get(data.model)
    authorize_model(runtime.name)
    pair_queries = _pairs(queries, texts)
    if len(texts) > settings.limits.max_documents:
        raise PayloadTooLargeError(
            f"too many pairs: {len(texts)} > {settings.limits.max_documents} (limits.max_documents)"
        )
    # vLLM's order: the request's instruction, else the template's `instruction`, else `instruct`.
    kw_instruction, kw_instruct = (_template_instruction(data, name) for name in ("instruction", "instruct"))
    instruction, instruct = data.instruction or kw_instruction, data.instruct or kw_instruct
    groups: dict[str, list[int]] = {}
    for i, query in enumerate(pair_queries):
        groups.setdefault(query, []).append(i)
    rid = request_id(request.scope)
    # Each group is one service call holding one of the model's max_concurrent_requests slots:
    # never more at once than the model admits, or one request on an idle model refuses itself.
    limit = runtime.config.max_concurrent_requests
    gate = asyncio.Semaphore(max(1, min(_GROUPS_AT_ONCE, limit)))

    async def run(query: str, indices: Sequence[int]) -> RerankOutcome:
        cohere = RerankRequest(
            query=query,
            documents=[texts[i] for i in indices],
            model=data.model,
            max_tokens_per_doc=data.max_tokens_per_doc or None,
            instruction=instruction,
            instruct=instruct,
        )
        async with gate:
            return await service.rerank(
                cohere, api_version="1", request_id=rid, raw_scores=data.use_activation is False
            )

    # The first failure answers the request: the other groups' scores would be thrown away, so
    # their engine work is cancelled, and awaited, so no task outlives its request.
    tasks = [asyncio.ensure_future(run(q, idx)) for q, idx in groups.items()]
    try:
        outcomes: list[RerankOutcome] = list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    scores = [0.0] * len(texts)
    for indices, outcome in zip(groups.values(), outcomes, strict=True):
        for r in outcome.response.results:
            scores[indices[r.index]] = r.relevance_score
    tokens = sum(o.input_tokens for o in outcomes)
    response = VllmScoreResponse(
        id=f"score-{rid}",
        created=int(time.time()),
        model=outcomes[0].model,
        data=[VllmScoreData(index=i, score=s) for i, s in enumerate(scores)],
        usage=VllmUsage(prompt_tokens=tokens, total_tokens=tokens),
    )
    return Response(response, status_code=200, headers=finish(VLLM, outcomes, len(texts)))
