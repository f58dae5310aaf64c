"""Wire formats of the rerank routes: one request superset, one response superset.

The request struct accepts what Cohere v1, Cohere v2 (including the fields old SDKs 5.9-5.15
still send there) and Jina clients put on the wire; every optional field also accepts JSON
``null`` because the cohere SDK sends explicit ``None`` arguments as null. Unknown fields are
ignored, as Cohere and vLLM do, so newer clients keep working.

The response is the superset every client parser we know accepts (api-compat.md section 8):
Cohere's ``id/results/meta`` plus Jina's ``model/usage``; ``document`` is omitted, never null.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from schemas.config.base import MODEL_NAME_MAX_LENGTH

__all__ = (
    "ApiVersion",
    "BilledUnits",
    "ErrorBody",
    "ModelCard",
    "ModelList",
    "RequestModelName",
    "RerankMeta",
    "RerankRequest",
    "RerankResponse",
    "RerankResult",
    "TextObject",
    "Tokens",
    "Usage",
)

# Bounded above so OpenAPI states the range and no engine or tokenizer sees an integer it
# cannot hold (msgspec decodes JSON integers of any size).
INT32_MAX = 2**31 - 1
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]


# No configured name is longer, so a longer one is refused (422) before it can be echoed whole
# in the 404 or the access log.
RequestModelName = Annotated[str, msgspec.Meta(max_length=MODEL_NAME_MAX_LENGTH)]


# Constraints the service checks with its own messages (422): stated in the JSON schema only
# (extra_json_schema), so OpenAPI describes them without changing the decoder's errors.
NonBlank = msgspec.Meta(extra_json_schema={"minLength": 1, "pattern": r"\S"})


class TextObject(msgspec.Struct, kw_only=True, frozen=True):
    """Jina lets the query be an object with a ``text`` key."""

    text: Annotated[str, NonBlank]


# Schema only: an object document needs a string `text` (or rank_fields naming its keys, which a
# schema cannot express; the schema states the stricter form).
DocumentObject = msgspec.Meta(extra_json_schema={"required": ["text"], "properties": {"text": {"type": "string"}}})


class RerankRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Body of ``POST /v1/rerank``, ``/v2/rerank`` and ``/rerank``."""

    query: Annotated[
        Annotated[str, NonBlank] | TextObject,
        msgspec.Meta(
            description='The search query (a string, or Jina\'s {"text": ...} object); not empty or only whitespace.'
        ),
    ]
    documents: Annotated[
        list[str | Annotated[dict[str, Any], DocumentObject]],
        msgspec.Meta(
            description=(
                "Documents to rank: strings, or objects with a `text` key (other keys are kept "
                "and echoed back; `rank_fields` picks the keys to rank on). At least one; at most "
                "the gateway's limits.max_documents (413 beyond)."
            ),
            extra_json_schema={"minItems": 1},
        ),
    ]
    model: Annotated[RequestModelName | None, msgspec.Meta(description="Public model name.")] = None
    top_n: Annotated[
        PositiveInt | None,
        msgspec.Meta(description="Return only the N best documents (default: all)."),
    ] = None
    rank_fields: Annotated[
        Annotated[list[str], msgspec.Meta(extra_json_schema={"minItems": 1})] | None,
        msgspec.Meta(description="Keys of object documents to rank on, joined in this order."),
    ] = None
    return_documents: Annotated[
        bool | None,
        msgspec.Meta(
            description=(
                "Echo each document in its result. Default false (Cohere's); on /v1/rerank and /rerank "
                "true (Jina's) when `model` matches the gateway's [dialects] jina_models (default `jina-*`)."
            )
        ),
    ] = None
    max_chunks_per_doc: Annotated[
        PositiveInt | None,
        msgspec.Meta(description="Cap on the chunks a long document is split into (v1)."),
    ] = None
    max_tokens_per_doc: Annotated[
        PositiveInt | None,
        msgspec.Meta(description="Truncate each document to this many tokens before ranking (v2)."),
    ] = None
    priority: (
        Annotated[
            int,
            msgspec.Meta(ge=0, le=999, description="Accepted for Cohere v2 compatibility; not used."),
        ]
        | None
    ) = None
    instruction: Annotated[
        str | None,
        msgspec.Meta(description="Task instruction for instruction-following rerankers (Qwen3)."),
    ] = None
    instruct: Annotated[
        str | None,
        msgspec.Meta(description="Alias of `instruction` (DashScope's spelling)."),
    ] = None


class RerankResult(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


class ApiVersion(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    version: str
    is_experimental: bool | None = None


class BilledUnits(msgspec.Struct, kw_only=True, frozen=True):
    search_units: int


class Tokens(msgspec.Struct, kw_only=True, frozen=True):
    input_tokens: int


class RerankMeta(msgspec.Struct, kw_only=True, frozen=True):
    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: Tokens


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    total_tokens: int


class RerankResponse(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    results: list[RerankResult]
    meta: RerankMeta
    model: str
    usage: Usage


class ErrorBody(msgspec.Struct, kw_only=True, frozen=True):
    """Cohere's error body ``{message, id}`` plus ``detail``, which Jina-style clients read."""

    message: str
    id: str
    detail: str


class ModelCard(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "rerank-gateway"
    # Local models: the family serving it (qwen3, cross-encoder, bi-encoder, jina-v3; "auto"
    # until the engine has read the checkpoint); null for upstream and static models.
    family: str | None = None
    engine: str | None = None


class ModelList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[ModelCard]
    object: str = "list"
