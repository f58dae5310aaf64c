"""Strict request decoding: one function for every JSON body the gateway reads.

Litestar's default body parsing converts with ``strict=False`` (``"2"`` becomes ``2``,
``"true"`` becomes ``True``), which contradicts the documented promise (docs/api.md) of 422 for wrong types, and
lets msgspec recurse into arbitrarily nested arrays until ``RecursionError`` (a 500). Here the
body is decoded once with msgspec in strict mode, after a depth check that runs before any
recursion, and every failure becomes one of our errors:

- empty body, not JSON, invalid UTF-8, lone surrogates, NaN/Infinity, trailing bytes -> 400
  :class:`~gateway.errors.MalformedRequestError`;
- nesting deeper than :data:`MAX_JSON_DEPTH` -> 400 (a clear message, checked before decoding);
- valid JSON of the wrong shape or type, or a number too large for a float (``1e400``) -> 422
  :class:`~gateway.errors.InvalidRequestError` whose message carries msgspec's JSON path
  (``... - at `$.top_n```).

One exception to "no coercion": a number with no fractional part (``148.0``, ``2e1``) is accepted
where an integer is expected. The OpenAPI says ``integer``, and JSON Schema's ``integer`` is "a
number with a zero fractional part", so schema-driven clients (and Python code computing
``len(docs) / 2``) send such values; ``2.5`` is still a 422. Only integer-typed places change:
a float inside a document's free-form metadata is echoed as sent.

:class:`StrictBody` plugs :func:`decode_json` into Litestar as a DTO, so a handler keeps its
typed ``data`` argument and its OpenAPI request schema, generated from the same struct.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Generator, Hashable
from typing import Any, Final, TypeVar, cast

import msgspec
from litestar.dto import AbstractDTO, DTOFieldDefinition
from litestar.typing import FieldDefinition

from gateway.errors import InvalidRequestError, MalformedRequestError

__all__ = ("MAX_JSON_CONTAINERS", "MAX_JSON_DEPTH", "StrictBody", "check_depth", "decode_json")

T = TypeVar("T")

# Deep enough for any document metadata we have seen (Cohere documents are flat objects), far
# below the C recursion limit msgspec runs into (~1,000 on CPython 3.11).
MAX_JSON_DEPTH: Final = 64
# Arrays + objects in one body (10,000 documents with 100 each): bounds the depth check's work.
MAX_JSON_CONTAINERS: Final = 1_000_000

# A JSON string literal (the unrolled form is linear, even on multi-megabyte strings).
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")


def check_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise 400 when arrays/objects nest deeper than ``limit``, without recursing.

    Brackets inside string literals do not count. The work is C loops (``count``, ``translate``,
    a regex) over spans, not Python per byte: a span whose opening brackets could not lift the
    depth over the limit is skipped whole, and only a span that could is halved and looked at
    again. A body with more than MAX_JSON_CONTAINERS arrays/objects is refused first, so the
    check costs well under a second on any body (a per-byte Python loop took 5 s on 18 MB).
    """
    if _few_brackets(body, limit):
        return  # too few brackets to be too deep (every body of string documents)
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) > 2 * MAX_JSON_CONTAINERS:
        raise MalformedRequestError(
            f"JSON has too many arrays/objects: more than {MAX_JSON_CONTAINERS:,}; flatten the request"
        )
    # Each pass removes the innermost empty pairs, so the deepest level drops by exactly one;
    # flat bodies (lists of documents) collapse to almost nothing at C speed.
    passes = min(2, limit)
    for _ in range(passes):
        brackets = brackets.replace(b"[]", b"").replace(b"{}", b"")
    depth = 0
    try:
        for start in range(0, len(brackets), _SPAN):
            depth = _span_depth(brackets[start : start + _SPAN], depth, limit - passes)
    except _TooDeep:
        raise MalformedRequestError(
            f"JSON is nested too deeply: more than {limit} levels of arrays/objects; flatten the request"
        ) from None


_SPAN: Final = 4096


def _few_brackets(body: bytes, limit: int) -> bool:
    """At most ``limit`` ``[`` and ``{`` in ``body``: found by ``find`` (memchr), which skips the
    text between brackets, and stops at ``limit`` + 1. ``count`` compares every byte in a loop
    (0.2 ms for two counts over a 56 kB body, more than decoding it)."""
    seen = 0
    for bracket in (0x5B, 0x7B):  # [ {
        at = body.find(bracket)
        while at >= 0:
            seen += 1
            if seen > limit:
                return False
            at = body.find(bracket, at + 1)
    return True


class _TooDeep(Exception):
    pass


def _span_depth(span: bytes, depth: int, limit: int) -> int:
    """The depth after ``span``, entered at ``depth``; raise when it goes over ``limit`` inside."""
    opens = span.count(b"[") + span.count(b"{")
    if depth + opens <= limit:  # the highest point inside is at most depth + opens
        return depth + 2 * opens - len(span)
    if len(span) == 1:
        raise _TooDeep
    half = len(span) // 2
    return _span_depth(span[half:], _span_depth(span[:half], depth, limit), limit)


def decode_json(body: bytes, type_: type[T]) -> T:
    """Decode ``body`` into ``type_`` strictly (no coercion); failures raise 400 or 422."""
    if not body.strip():
        raise MalformedRequestError("the request body is empty; send a JSON object")
    check_depth(body)
    try:
        try:
            return msgspec.json.decode(body, type=type_, strict=True)
        except msgspec.ValidationError as exc:
            if "got `float`" not in str(exc):
                raise InvalidRequestError(f"invalid request: {exc}") from None
        # Slow path, taken only by bodies with a float where msgspec wanted something else:
        # decode untyped, turn integral floats at integer-typed places into ints, validate again.
        # Any other error (2.5, or a later field) is then reported as the typed decode would.
        return _convert(_integral(msgspec.json.decode(body), _type_info(type_)), type_)
    except msgspec.ValidationError as exc:
        # The untyped decode's only ValidationError: a number too large for a float (1e400) is
        # valid JSON but an invalid value, a 422 as the typed decode reports it (not a 400).
        raise InvalidRequestError(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        raise MalformedRequestError(
            text if text.startswith("JSON is malformed") else f"JSON is malformed: {text}"
        ) from None
    except RecursionError:  # unreachable after check_depth; kept so no input can become a 500
        raise MalformedRequestError(f"JSON is nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None


def _convert(value: Any, type_: type[T]) -> T:
    try:
        return msgspec.convert(value, type_, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(f"invalid request: {exc}") from None


@functools.cache
def _cached_type_info(type_: Hashable) -> msgspec.inspect.Type:
    # Cached per request type: the slow path and the DTO's builtins decode ask for the same few types.
    return msgspec.inspect.type_info(type_)


def _type_info(type_: type[Any]) -> msgspec.inspect.Type:
    # A class is hashable; mypy does not see ``type[T]`` as ``Hashable`` without the cast.
    return _cached_type_info(cast("Hashable", type_))


def _integral(value: Any, info: msgspec.inspect.Type) -> Any:
    """``value`` (untyped JSON) with each integral float that ``info`` expects an integer for as an int.

    Walks the value and its type together, so a float is changed only where the type has an
    integer and no float (``int | None`` yes, ``int | float`` and ``Any`` no).
    """
    info = _bare(info)
    if isinstance(value, float):
        options = info.types if isinstance(info, msgspec.inspect.UnionType) else (info,)
        wants_int = any(isinstance(t, msgspec.inspect.IntType) for t in map(_bare, options))
        wants_float = any(isinstance(t, msgspec.inspect.FloatType) for t in map(_bare, options))
        if wants_int and not wants_float and math.isfinite(value) and value.is_integer():
            return int(value)
        return value
    if isinstance(info, msgspec.inspect.UnionType):
        # A JSON object or array matches at most one member of a union msgspec accepts.
        container = dict if isinstance(value, dict) else list if isinstance(value, list) else None
        for member in map(_bare, info.types):
            if container is dict and isinstance(member, msgspec.inspect.StructType | msgspec.inspect.DictType):
                return _integral(value, member)
            if container is list and isinstance(member, _SEQUENCES):
                return _integral(value, member)
        return value
    if isinstance(info, msgspec.inspect.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f.type for f in info.fields}
        return {k: _integral(v, fields[k]) if k in fields else v for k, v in value.items()}
    if isinstance(info, msgspec.inspect.DictType) and isinstance(value, dict):
        return {k: _integral(v, info.value_type) for k, v in value.items()}
    if isinstance(info, _SEQUENCES) and isinstance(value, list):
        return [_integral(v, info.item_type) for v in value]
    if isinstance(info, msgspec.inspect.TupleType) and isinstance(value, list):
        return [_integral(v, t) for v, t in zip(value, info.item_types, strict=False)] + value[len(info.item_types) :]
    return value


def _bare(info: msgspec.inspect.Type) -> msgspec.inspect.Type:
    while isinstance(info, msgspec.inspect.Metadata):
        info = info.type
    return info


_SEQUENCES: Final = (
    msgspec.inspect.ListType,
    msgspec.inspect.VarTupleType,
    msgspec.inspect.SetType,
    msgspec.inspect.FrozenSetType,
)


class StrictBody(AbstractDTO[T]):
    """A Litestar DTO whose only job is to decode the ``data`` argument with :func:`decode_json`.

    Usage: ``@post(..., dto=StrictBody[RerankRequest], return_dto=None)`` with a handler argument
    ``data: RerankRequest``. Litestar reads the body (size limit, 413) and hands the bytes here;
    the OpenAPI request schema is the struct's own, constraints included.
    """

    def decode_bytes(self, value: bytes) -> Any:
        return decode_json(value, self.model_type)

    def decode_builtins(self, value: dict[str, Any]) -> Any:
        return _convert(_integral(value, _type_info(self.model_type)), self.model_type)

    @classmethod
    def create_for_field_definition(
        cls, field_definition: FieldDefinition, handler_id: str, backend_cls: Any = None
    ) -> None:
        return None  # no transfer models: msgspec decodes straight into the struct

    @classmethod
    def create_openapi_schema(cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any) -> Any:
        return schema_creator.for_field_definition(
            FieldDefinition.from_annotation(cls.model_type, kwarg_definition=field_definition.kwarg_definition)
        )

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Generator[DTOFieldDefinition, None, None]:
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        return False
