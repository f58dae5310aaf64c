"""Make the OpenAPI document say what the wire does.

Litestar generates the paths from the handlers, but its schemas of msgspec structs drop
constraints on nullable fields (``top_n``'s minimum) and its error responses are its own
``{status_code, detail}``. So once the app is built, :func:`finalize_openapi` edits the
generated document in place:

- the wire structs' schemas come from msgspec itself (``msgspec.json.schema_components``, the
  same library that decodes them), constraints included;
- ``model`` is an enum of the configured names and aliases, ``documents`` is capped at
  ``limits.max_documents``, and ``/v2/rerank`` gets its own request schema with ``model``
  required, so a request valid by the schema is never refused with 422;
- rerank operations declare bearer security only when API keys are configured (open otherwise);
- every rerank operation lists every status of the error table (``gateway.errors``) with the
  real body ``{message, id, detail}`` and the headers that come with it.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import msgspec
from litestar import Litestar

from schemas.config import Settings
from schemas.rerank import ErrorBody, ModelList, RerankRequest, RerankResponse

__all__ = ("ADMIN_ERRORS", "ERROR_RESPONSES", "RERANK_ERRORS", "finalize_openapi")

_REF = "#/components/schemas/{name}"

# Status -> when, as in docs/api.md's error table (the table itself lives in gateway.errors).
ERROR_RESPONSES: Final[dict[int, str]] = {
    400: "The body is not JSON (malformed, empty, invalid UTF-8, nested deeper than 64 levels, over 1,000,000 arrays/objects).",
    401: "API keys are configured and the key is missing, unknown or expired.",
    403: "The API key does not cover the requested model; the admin API: the key is not an admin key.",
    404: "Unknown model (the message lists the available names).",
    409: "Admin API: the key id exists already, or the config file owns that key.",
    408: "The body did not arrive within server.body_read_timeout_s; the connection is closed.",
    413: "Body over limits.max_body_bytes, or more documents or chunks than the limits allow.",
    422: "Valid JSON but not a valid request: wrong types (the message gives the JSON path), empty "
    "query, no documents, out-of-range integers, object document without text; an upstream "
    "rejecting the input.",
    429: "The API key is over its rpm, tpm or max_concurrent limit, or a daily or monthly quota (the message "
    "names it and when it resets).",
    500: "A bug: generic message, details only in the log.",
    502: "The engine failed or returned invalid scores; an upstream failed.",
    503: "Model loading, failed, unhealthy or at max_concurrent_requests; upstream unavailable; "
    "rate-limit store down with redis_failure = closed.",
    501: "Admin API: key changes need the shared key store, limits.redis_url.",
    504: "The engine did not answer within the model's timeout_s, or an upstream replica within its read_timeout_s (or it answered 504 itself).",
}
# The statuses a rerank route can answer, and those of the admin API (gateway.http.admin).
RERANK_ERRORS: Final = tuple(status for status in ERROR_RESPONSES if status not in (409, 501))
ADMIN_ERRORS: Final = (400, 401, 403, 404, 409, 413, 422, 500, 501, 503)
_HEADERS: Final[dict[int, tuple[str, ...]]] = {
    401: ("WWW-Authenticate",),
    429: ("Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"),
    503: ("Retry-After",),
}
_COMMON_HEADERS: Final = {
    "x-request-id": "The request id (the client's sane x-request-id, else a new one); also the body's id.",
    "x-process-time-ms": "Time the gateway spent on the request.",
}


def _header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


def _error_response(status: int) -> dict[str, Any]:
    headers = {name: _header(desc) for name, desc in _COMMON_HEADERS.items()}
    headers.update({name: _header(f"Sent with {status}.") for name in _HEADERS.get(status, ())})
    return {
        "description": ERROR_RESPONSES[status],
        "headers": headers,
        "content": {"application/json": {"schema": {"$ref": _REF.format(name="ErrorBody")}}},
    }


def _request_schemas(settings: Settings, components: dict[str, Any]) -> None:
    names = [name for model in settings.models for name in (model.name, *model.aliases)]
    v1 = components["RerankRequest"]
    v1["properties"]["model"]["anyOf"] = [{"type": "string", "enum": names}, {"type": "null"}]
    v1["properties"]["documents"]["maxItems"] = settings.limits.max_documents
    v2 = copy.deepcopy(v1)
    v2["title"] = "RerankRequestV2"
    v2["description"] = "Body of ``POST /v2/rerank``: as v1, with ``model`` required."
    v2["properties"]["model"] = {"description": "Public model name or alias.", "type": "string", "enum": names}
    v2["required"] = [*v1["required"], "model"]
    components["RerankRequestV2"] = v2


def finalize_openapi(app: Litestar, settings: Settings) -> None:
    """Edit the app's generated OpenAPI document in place (served as built here)."""
    # Litestar's OpenAPI plugin builds the document once and serves that same dict.
    document: dict[str, Any] = app.plugins.get("OpenAPIPlugin").provide_openapi_schema()
    _, wire = msgspec.json.schema_components([RerankRequest, RerankResponse, ErrorBody, ModelList], ref_template=_REF)
    _request_schemas(settings, wire)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(wire)
    ready = document.get("paths", {}).get("/ready", {}).get("get")
    if ready is not None:  # not ready answers 503 with the same body as ready
        ok = ready["responses"]["200"]
        ready["responses"]["503"] = {**ok, "description": "Some model is not ready (Retry-After set)."}
    for path, item in document.get("paths", {}).items():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            if path.startswith("/admin/"):
                responses = operation.setdefault("responses", {})
                for status in ADMIN_ERRORS:  # Litestar's own {status_code, detail} is not what is sent
                    responses[str(status)] = _error_response(status)
                continue
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            if body.get("schema", {}).get("$ref") != _REF.format(name="RerankRequest"):
                continue
            if "/v2/" in path:
                body["schema"] = {"$ref": _REF.format(name="RerankRequestV2")}
            if not settings.auth.keys:
                operation.pop("security", None)  # no keys configured: the route is open
            responses = operation.setdefault("responses", {})
            ok = responses.get("200", {})
            ok.setdefault("headers", {}).update(
                {name: _header(desc) for name, desc in _COMMON_HEADERS.items()}
                | {
                    "x-tokenize-time-ms": _header("Time spent tokenizing."),
                    "x-inference-time-ms": _header("Time spent in the engine."),
                    "x-rerank-target": _header(
                        "Only when the model is a chain (docs/routing.md): the configured model that computed the scores."
                    ),
                }
            )
            for status in RERANK_ERRORS:
                responses[str(status)] = _error_response(status)
