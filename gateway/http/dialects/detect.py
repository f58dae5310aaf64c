"""Which dialect a ``/rerank`` body speaks, decided once at decode by the body's shape.

Cohere, Jina and vLLM clients send ``documents``; TEI clients send ``texts``. The top-level keys
are read first with every value left as :class:`msgspec.Raw` (one pass that copies no value),
then the body is decoded strictly (:func:`gateway.http.decoding.decode_json`) into the one struct its
shape names. Nothing is parsed twice into values and no parse is retried as another type. A body
with neither key matches no dialect and gets the Cohere 422 naming both shapes.

Errors of a TEI-shaped request are answered in TEI's shape: decode errors carry the dialect on
the exception (the DTO has no request), later ones find it in the request's scope state.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec
from litestar import Request, Response
from litestar.typing import FieldDefinition

from gateway.errors import InvalidRequestError, MalformedRequestError, error_response
from gateway.http.decoding import StrictBody, check_depth, decode_json
from gateway.http.dialects.tei import TEI, is_tei, mark_tei, tei_error_response
from schemas.dialects import TeiRerankRequest
from schemas.rerank import RerankRequest

__all__ = ("DetectedRequest", "RerankDialectBody", "detect_rerank_body", "rerank_error_response")

Dialect = Literal["cohere", "tei"]


class DetectedRequest(msgspec.Struct, kw_only=True, frozen=True):
    """A decoded ``/rerank`` body and the dialect its shape names (not a wire type)."""

    dialect: Dialect
    body: Any  # RerankRequest for "cohere", TeiRerankRequest for "tei"


class _Shape(msgspec.Struct):
    """The keys that tell the dialects apart; values stay undecoded, other keys are skipped.

    An absent key keeps the empty default (msgspec has no ``Raw | None``); a present one holds
    its value's bytes, at least ``null``.
    """

    documents: msgspec.Raw = msgspec.Raw()
    texts: msgspec.Raw = msgspec.Raw()


_NO_DIALECT: Final = (
    "invalid request: the body matches no rerank dialect: expected a Cohere/Jina body "
    '(`query` and `documents`, e.g. {"query": "...", "documents": ["..."]}) or a TEI body '
    '(`query` and `texts`, e.g. {"query": "...", "texts": ["..."]})'
)


def detect_rerank_body(body: bytes) -> DetectedRequest:
    if not body.strip():
        raise MalformedRequestError("the request body is empty; send a JSON object")
    check_depth(body)  # before msgspec walks the body, even to skip values
    try:
        shape = msgspec.json.decode(body, type=_Shape)
    except msgspec.ValidationError:
        raise InvalidRequestError(f"{_NO_DIALECT}; got JSON that is not an object") from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        raise MalformedRequestError(
            text if text.startswith("JSON is malformed") else f"JSON is malformed: {text}"
        ) from None
    if shape.documents:
        # `documents` wins: Cohere ignores unknown keys, so a Cohere body with a stray `texts` stays Cohere.
        return DetectedRequest(dialect="cohere", body=decode_json(body, RerankRequest))
    if shape.texts:
        try:
            return DetectedRequest(dialect=TEI, body=decode_json(body, TeiRerankRequest))
        # Any decoding error, re-raised as it is: only tagged, so the error handler answers in TEI's shape.
        except Exception as exc:  # noqa: BLE001
            raise mark_tei(exc) from None
    raise InvalidRequestError(_NO_DIALECT)


class RerankDialectBody(StrictBody[DetectedRequest]):
    """Litestar DTO for ``/rerank`` and ``/v1/rerank``: detects the dialect, decodes strictly.

    The OpenAPI request body is ``oneOf`` the Cohere/Jina and the TEI request schemas.
    """

    def decode_bytes(self, value: bytes) -> Any:
        return detect_rerank_body(value)

    def decode_builtins(self, value: dict[str, Any]) -> Any:
        return detect_rerank_body(msgspec.json.encode(value))

    @classmethod
    def create_openapi_schema(cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any) -> Any:
        union = RerankRequest | TeiRerankRequest
        return schema_creator.for_field_definition(
            FieldDefinition.from_annotation(union, kwarg_definition=field_definition.kwarg_definition)
        )


def rerank_error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Errors of the shared ``/rerank`` routes: TEI's body for TEI-shaped requests, else Cohere's."""
    if is_tei(request, exc):
        return tei_error_response(request, exc)
    return error_response(request, exc)
