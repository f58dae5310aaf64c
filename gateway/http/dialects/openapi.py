"""The dialects' part of the OpenAPI document: their wire schemas and their error bodies.

Runs after :func:`gateway.http.openapi.finalize_openapi`, in the same spirit: the schemas come from
msgspec (constraints included), limits and model names from the config, and every error status
is listed with the body the dialect really answers -- on ``/rerank``, Cohere's or TEI's
(``oneOf``: which one depends on the body's shape), on ``/score``, vLLM's.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from litestar import Litestar

from gateway.http.openapi import ERROR_RESPONSES, RERANK_ERRORS, _error_response
from schemas.config import Qwen3LocalConfig, Settings, StaticEngineConfig
from schemas.dialects import (
    TeiError,
    TeiInfo,
    TeiRank,
    TeiRerankRequest,
    VllmErrorBody,
    VllmScoreRequest,
    VllmScoreResponse,
)

__all__ = ("finalize_dialects_openapi",)

_REF = "#/components/schemas/{name}"
_RERANK_PATHS: Final = ("/rerank", "/v1/rerank", "/v1/v1/rerank")
_SCORE_PATHS: Final = ("/score", "/v1/score")
_PAIRS: Final = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _tei_request(schema: dict[str, Any], settings: Settings) -> None:
    props = schema["properties"]
    props["texts"]["maxItems"] = settings.limits.max_documents
    names = {n: m for m in settings.models for n in (m.name, *m.aliases)}
    model = names.get(settings.dialects.tei_model) if settings.dialects.tei_model else None
    model = model or (settings.models[0] if settings.models else None)
    if model is not None and not isinstance(model, Qwen3LocalConfig):
        # Scored upstream: only chunking or cutting at the end (the upstream's own) is possible.
        props["truncation_direction"] = {**props["truncation_direction"], "enum": ["Right", "right"]}
        props["truncate"] = {**props["truncate"], "anyOf": [{"type": "boolean", "enum": [True]}, {"type": "null"}]}
    if isinstance(model, StaticEngineConfig) and not model.supports_raw_scores:
        props["raw_scores"] = {**props["raw_scores"], "enum": [False]}


def _score_request(schema: dict[str, Any], settings: Settings) -> None:
    names = [n for m in settings.models for n in (m.name, *m.aliases)]
    props = schema["properties"]
    props["model"]["anyOf"] = [{"type": "string", "enum": names}, {"type": "null"}]
    for name in ("text_2", "documents", "items", "data_2"):
        for branch in props[name]["anyOf"][0]["anyOf"]:
            if branch.get("type") == "array":
                branch["maxItems"] = settings.limits.max_documents
    schema["description"] = (
        schema.get("description", "") + " A list on the first side needs as many texts on the second "
        "(N:N); lengths that differ are a 400 (JSON Schema cannot state it)."
    ).strip()
    # Exactly one pair of sides, both present and not null.
    schema["oneOf"] = [
        {"required": [a, b], "properties": {a: {"not": {"type": "null"}}, b: {"not": {"type": "null"}}}}
        for a, b in _PAIRS
    ]


def _errors(body: dict[str, Any], statuses: dict[int, str]) -> dict[str, Any]:
    out = {}
    for status, text in statuses.items():
        # The Cohere routes' entry (its headers: x-request-id, Retry-After, ...) with this body.
        response = _error_response(status if status in ERROR_RESPONSES else 502)
        out[str(status)] = {**response, "description": text, "content": {"application/json": {"schema": body}}}
    return out


def finalize_dialects_openapi(app: Litestar, settings: Settings) -> None:
    document: dict[str, Any] = app.plugins.get("OpenAPIPlugin").provide_openapi_schema()
    _, wire = msgspec.json.schema_components(
        [TeiRerankRequest, TeiRank, TeiError, TeiInfo, VllmScoreRequest, VllmScoreResponse, VllmErrorBody],
        ref_template=_REF,
    )
    _tei_request(wire["TeiRerankRequest"], settings)
    _score_request(wire["VllmScoreRequest"], settings)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(wire)
    paths = document.get("paths", {})
    either = {"oneOf": [_ref("ErrorBody"), _ref("TeiError")]}
    rerank = {status: ERROR_RESPONSES[status] for status in RERANK_ERRORS}  # not the admin API's own
    tei_statuses = {
        **rerank,
        400: ERROR_RESPONSES[400] + " TEI body: `texts` is empty (`Empty`).",
        424: "TEI body only: the engine failed, or raw_scores on a model without raw output (`Backend`).",
    }
    for path in _RERANK_PATHS:
        operation = paths.get(path, {}).get("post")
        if operation is None:
            continue
        # anyOf, not oneOf: both schemas allow unknown keys, so a body with `documents` and
        # `texts` fits both, and the gateway takes it (as Cohere's).
        body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
        if "oneOf" in body.get("schema", {}):
            body["schema"] = {"anyOf": body["schema"]["oneOf"]}
        if not settings.auth.keys:
            operation.pop("security", None)
        operation.setdefault("responses", {}).update(_errors(either, tei_statuses))
    vllm_statuses = {s: t for s, t in rerank.items() if s != 422}
    vllm_statuses[400] = "Invalid request (vLLM answers 400 where the Cohere routes answer 422), or not JSON."
    for path in _SCORE_PATHS:
        operation = paths.get(path, {}).get("post")
        if operation is None:
            continue
        if not settings.auth.keys:
            operation.pop("security", None)
        operation.setdefault("responses", {}).update(_errors(_ref("VllmErrorBody"), vllm_statuses))
