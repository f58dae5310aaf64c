"""HTTP handlers: thin, they decode, call the service and shape the HTTP response.

``/v1/rerank`` serves Cohere v1 and Jina clients (and TEI clients: a ``texts`` body is TEI's, see
``gateway.http.dialects``), ``/v2/rerank`` Cohere v2 (and the fields old
SDKs still send there), ``/rerank`` is an alias of v1. ``/v1/v1/rerank`` and ``/v1/v2/rerank``
catch the common ``base_url=".../v1"`` misconfiguration of the cohere SDK.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, cast

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.params import JSONBody

from gateway.errors import InvalidRequestError
from gateway.http.decoding import StrictBody
from gateway.http.dialects import DIALECT_ROUTES, DetectedRequest, RerankDialectBody, rerank_error_response, tei_rerank
from gateway.http.middleware import log_fields, request_id
from gateway.serving.models import ModelRegistry
from gateway.serving.service import RerankOutcome, RerankService
from schemas.config import Settings
from schemas.dialects import TeiRank
from schemas.rerank import ModelCard, ModelList, RerankRequest, RerankResponse

__all__ = ("ROUTES",)


def _response(outcome: RerankOutcome) -> Response[RerankResponse]:
    fields = log_fields()
    fields.update(model=outcome.model, documents=outcome.documents, items=outcome.items, tokens=outcome.input_tokens)
    headers = {
        "x-tokenize-time-ms": f"{outcome.tokenize_ms:.2f}",
        "x-inference-time-ms": f"{outcome.inference_ms:.2f}",
    }
    if outcome.cache is not None:  # the response cache is on
        headers["x-cache"] = outcome.cache
        fields["cache"] = outcome.cache
    if outcome.target is not None:  # a chain: the configured model that computed these scores
        headers["x-rerank-target"] = outcome.target
        fields["target"] = outcome.target
        if outcome.attempts is not None:
            fields["attempts"] = outcome.attempts
    return Response(outcome.response, status_code=200, headers=headers)


async def _rerank(request: Request[Any, Any, Any], data: RerankRequest, version: str) -> Response[RerankResponse]:
    service: RerankService = request.app.state.service
    log_fields().update(model=data.model, documents=len(data.documents))
    outcome = await service.rerank(data, api_version=version, request_id=request_id(request.scope))
    return _response(outcome)


@post(
    ["/v1/rerank", "/rerank", "/v1/v1/rerank"],
    status_code=200,
    summary="Rerank (Cohere v1 / Jina, or TEI when the body has `texts`)",
    tags=["rerank"],
    security=[{"bearer": []}],  # enforced by gateway.http.access when keys are configured
    # Strict msgspec decode into the dialect the body's shape names (gateway.http.dialects.detect).
    dto=RerankDialectBody,
    return_dto=None,
    exception_handlers={Exception: rerank_error_response, HTTPException: rerank_error_response},
)
async def rerank_v1(
    request: Request[Any, Any, Any], data: JSONBody[DetectedRequest]
) -> Response[RerankResponse | list[TeiRank]]:
    # Response is invariant in its body type: each branch's answer is one of this route's two bodies.
    if data.dialect == "tei":
        return cast("Response[RerankResponse | list[TeiRank]]", await tei_rerank(request, data.body))
    body: RerankRequest = data.body
    if body.return_documents is None:
        # Jina's default (true) for the model names its clients send, Cohere's (false) for the rest.
        settings: Settings = request.app.state.settings
        if any(fnmatchcase(body.model or "", pattern) for pattern in settings.dialects.jina_models):
            body = msgspec.structs.replace(body, return_documents=True)
    return cast("Response[RerankResponse | list[TeiRank]]", await _rerank(request, body, "1"))


@post(
    ["/v2/rerank", "/v1/v2/rerank"],
    status_code=200,
    summary="Rerank (Cohere v2)",
    tags=["rerank"],
    security=[{"bearer": []}],
    dto=StrictBody[RerankRequest],
    return_dto=None,
)
async def rerank_v2(request: Request[Any, Any, Any], data: JSONBody[RerankRequest]) -> Response[RerankResponse]:
    if not data.model:
        raise InvalidRequestError("invalid request: a model parameter is required for this endpoint.")
    return await _rerank(request, data, "2")


@get(["/v1/models", "/models"], tags=["models"])
async def list_models(state: State) -> ModelList:
    registry: ModelRegistry = state.registry
    cards = [
        ModelCard(id=name, family=rt.family, engine=rt.kind)
        for rt in registry
        for name in (rt.name, *rt.config.aliases)
    ]
    return ModelList(data=cards)


@get("/health", operation_id="health", tags=["health"])
async def health(state: State) -> Response[dict[str, str]]:
    """Liveness: 200 while the process can serve or may recover by itself; 503 once every model
    has been failed or unhealthy longer than ``server.liveness_failure_after_s`` (restart it)."""
    registry: ModelRegistry = state.registry
    failure = registry.liveness_failure()
    if failure is None:
        return Response({"status": "ok"}, status_code=200)
    return Response({"status": "failed", "message": failure}, status_code=503)


@get("/ready", operation_id="ready", tags=["health"])
async def ready(state: State) -> Response[dict[str, Any]]:
    """Every model is loaded and healthy (readiness), with each model's state."""
    registry: ModelRegistry = state.registry
    await registry.refresh_health()
    ok = registry.ready
    body = {"status": "ready" if ok else "not_ready", "models": registry.statuses()}
    return Response(body, status_code=200 if ok else 503, headers=None if ok else {"Retry-After": "5"})


ROUTES = [rerank_v1, rerank_v2, list_models, health, ready, *DIALECT_ROUTES]
