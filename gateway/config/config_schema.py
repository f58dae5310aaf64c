"""The :class:`schemas.config.Settings` type walked by path: env values typed, errors in words.

``gateway.config.settings`` reads TOML strictly (``port = "8001"`` is an error, as a JSON body's
``"2"`` is on the request path) but an environment variable is always a string, so each
``RERANK_*`` value is converted to the type of the field it names before the whole config is
validated. The walk also turns msgspec's terse messages (``Invalid enum value 'VERBOSE'``,
``Expected `str` matching regex ...``) into sentences that list the allowed values or say what
the field wants (the ``description`` of its ``msgspec.Meta``).
"""

from __future__ import annotations

import difflib
import functools
import re
import types
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

import msgspec

from schemas.config import Settings

__all__ = ("EnvValue", "Path", "dotted", "field_type", "humanize", "parse_path", "type_env_values")

Path = tuple[str | int, ...]


class EnvValue(str):
    """A value from an environment variable, not yet converted to its field's type."""

    var: str

    def __new__(cls, value: str, var: str) -> Self:
        self = super().__new__(cls, value)
        self.var = var
        return self


class _Problem(ValueError):
    """A config mistake found while walking; ``path`` is where, ``var`` the variable that caused it."""

    def __init__(self, path: Path, message: str, var: str | None = None) -> None:
        super().__init__(message)
        self.path, self.var = path, var


def dotted(path: Path) -> str:
    """``("models", 0, "path")`` -> ``models[0].path``: how the docs and the other errors name a field."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "the config"


def parse_path(text: str) -> Path:
    """msgspec's ``$.models[0].engine`` -> ``("models", 0, "engine")``."""
    return tuple(int(i) if i else k for k, i in re.findall(r"\.(\w+)|\[(\d+)\]", text.removeprefix("$")))


def _unwrap(tp: Any) -> tuple[Any, list[msgspec.Meta]]:
    metas: list[msgspec.Meta] = []
    while get_origin(tp) is Annotated:
        base, *extra = get_args(tp)
        metas += [m for m in extra if isinstance(m, msgspec.Meta)]
        tp = base
    return tp, metas


def _members(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


@functools.cache
def _fields(cls: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.encode_name: f.type for f in msgspec.structs.fields(cls)}


def _tags(structs: list[type[msgspec.Struct]]) -> tuple[str | None, dict[str, type[msgspec.Struct]]]:
    field = next((s.__struct_config__.tag_field for s in structs if s.__struct_config__.tag_field), None)
    return field, {str(s.__struct_config__.tag): s for s in structs if s.__struct_config__.tag is not None}


def _resolve(tp: Any, node: Any, path: Path) -> Any:
    """The one type of a union that ``node`` is decoded as (a tagged struct by its tag), else ``tp``."""
    base, _ = _unwrap(tp)
    members = [_unwrap(m)[0] for m in _members(base)]
    structs = [m for m in members if _is_struct(m)]
    if not structs or not isinstance(node, dict):
        return base if len(members) == 1 else tp
    tag_field, by_tag = _tags(structs)
    if tag_field is None or len(by_tag) < 2:
        return structs[0]
    tag = node.get(tag_field)
    if tag is None:
        raise _Problem(path, f"{dotted(path)} has no {tag_field}; set {tag_field} to one of {_listing(by_tag)}")
    if tag not in by_tag:
        where = dotted((*path, tag_field))
        raise _Problem(
            (*path, tag_field),
            f"{where}: unknown {tag_field} {str(tag)!r}; the {tag_field}s are {_listing(by_tag)}",
            getattr(tag, "var", None),
        )
    return by_tag[tag]


def _listing(values: Any) -> str:
    return ", ".join(repr(v) for v in sorted(values, key=str))


def _child(tp: Any, key: str | int, path: Path, var: str | None) -> Any:
    """The type of ``node[key]`` for a node of (resolved) type ``tp``."""
    if tp is Any:
        return Any
    if _is_struct(tp):
        fields = _fields(tp)
        if key == tp.__struct_config__.tag_field:
            return str
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; its fields are {_listing(fields)}"
            raise _Problem(path, f"{dotted(path)} has no field {key!r}{hint}", var)
        return fields[key]
    origin, args = get_origin(tp), get_args(tp)
    if origin in (tuple, list) and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return Any


def field_type(path: Path, raw: Any) -> Any:
    """The declared type at ``path`` (``Any`` where the schema does not say), walking ``raw`` for tags."""
    tp: Any = Settings
    node = raw
    for i, key in enumerate(path):
        try:
            tp = _child(_resolve(tp, node, path[:i]), key, path[:i], None)
        except _Problem:
            return Any
        node = (
            node.get(key)
            if isinstance(node, dict)
            else (node[key] if isinstance(node, list) and isinstance(key, int) and key < len(node) else None)
        )
    return tp


def type_env_values(raw: dict[str, Any]) -> None:
    """Replace every :class:`EnvValue` in ``raw`` by its value converted to its field's type.

    Raises ValueError subclasses whose ``var`` names the variable and ``path`` the field; also
    refuses unknown fields and unknown engines anywhere (with the close match or the list).
    """
    _walk(raw, Settings, (), None)


def _walk(node: Any, tp: Any, path: Path, var: str | None) -> Any:
    if isinstance(node, EnvValue):
        value = _convert_env(node, tp, path)
        return _walk(value, tp, path, node.var) if isinstance(value, dict | list) else value
    if isinstance(node, dict):
        resolved = _resolve(tp, node, path)
        # An engine set from the environment makes the entry's other fields its doing too.
        tag_field = resolved.__struct_config__.tag_field if _is_struct(resolved) else None
        tag_var = getattr(node.get(tag_field), "var", None) if tag_field else None
        for key in list(node):
            child = node[key]
            child_var = var or _env_var_in(child) or tag_var
            node[key] = _walk(child, _child(resolved, key, path, child_var), (*path, key), var)
    elif isinstance(node, list):
        resolved = _resolve(tp, node, path)
        for i, item in enumerate(node):
            node[i] = _walk(item, _child(resolved, i, path, var), (*path, i), var)
    return node


def _env_var_in(node: Any) -> str | None:
    """The variable that put ``node`` (or something under it) into the config, if one did."""
    if isinstance(node, EnvValue):
        return node.var
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    return next((v for v in map(_env_var_in, values) if v), None)


def _convert_env(value: EnvValue, tp: Any, path: Path) -> Any:
    base, _ = _unwrap(tp)
    kinds = {_unwrap(m)[0] for m in _members(base)} - {type(None)}
    if all(k is str or get_origin(k) is Literal for k in kinds) and kinds:
        return str(value)  # a string field takes the text as is, even one starting with "[" or "{"
    text = str(value)
    if text[:1] in ("[", "{"):  # not `in "[{"`: "" is in every string
        try:
            return msgspec.json.decode(text)
        except msgspec.DecodeError:
            raise _Problem(path, f"{dotted(path)} looks like JSON but is not valid JSON", value.var) from None
    if base is Any:
        try:  # engine_args and the like: 1, 0.5, true as numbers and booleans, anything else as text
            return msgspec.json.decode(text)
        except msgspec.DecodeError:
            return text
    try:
        return msgspec.to_builtins(msgspec.convert(text, tp, strict=False))
    except msgspec.ValidationError as exc:
        message = str(exc).split(" - at ", 1)[0]
        raise _Problem(path, f"{dotted(path)}: {_sentence(message, path, tp, text, env=True)}", value.var) from None


# Environment values this long are not quoted in errors: RERANK_API_KEY needs at least 16
# characters, so a key put into the wrong variable (RERANK_AUTH__KEYS=rk-...) stays out of the log.
_SECRET_LENGTH = 16
_KIND = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "object": "a table",
    "array": "an array",
    "null": "nothing",
    "datetime": "a date-time",
}
_BOUND = {">=": "at least", "<=": "at most", ">": "greater than", "<": "less than"}


def humanize(message: str, raw: Any) -> tuple[Path, str]:
    """msgspec's ``<what> - at `$.path``` as (path, a sentence naming the field and what it accepts)."""
    what, _, where = message.partition(" - at ")
    path = parse_path(where.strip("`"))
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", what)
    if unknown:  # the walk reports these first; kept for configs built in code
        return path, f"{dotted(path)} has no field {unknown[1]!r}"
    missing = re.fullmatch(r"Object missing required field `(.+)`", what)
    if missing:
        return (*path, missing[1]), f"{dotted((*path, missing[1]))} is required"
    tp = field_type(path, raw)
    value = _value_at(raw, path)
    return path, f"{dotted(path)}: {_sentence(what, path, tp, value)}"


def _value_at(raw: Any, path: Path) -> Any:
    node = raw
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _sentence(what: str, path: Path, tp: Any, value: Any, *, env: bool = False) -> str:
    base, metas = _unwrap(tp)
    literal = next((m for m in (_unwrap(m)[0] for m in _members(base)) if get_origin(m) is Literal), None)
    if what.startswith(("Invalid enum value", "Invalid value")) and literal is not None:
        got = what.split(" value ", 1)[1]
        return f"invalid value {got}; allowed: {_listing(get_args(literal))}"
    typed = re.fullmatch(r"Expected `(\w+)(?: \| \w+)*`, got `(\w+)`", what)
    if typed:
        want, got = _KIND.get(typed[1], typed[1]), typed[2]
        if env:  # an environment value is always text: say which text did not convert
            if len(str(value)) >= _SECRET_LENGTH:  # perhaps a key in the wrong variable: not in logs
                return f"expected {want}, got a text of {len(str(value))} characters (not shown)"
            return f"expected {want}, got {value!r}"
        if got == "str" and typed[1] in ("int", "float", "bool") and isinstance(value, str):
            return f"expected {want}, got the string {value!r}; write it without quotes"
        return f"expected {want}, got {_KIND.get(got, got)}"
    bound = re.fullmatch(r"Expected `(\w+)` (>=|<=|>|<) (\S+)", what)
    if bound:
        return f"must be {_BOUND[bound[2]]} {bound[3]}"
    # An optional field (`ModelName | None`) keeps its description on the union's member.
    metas = metas + [m for member in _members(base) for m in _unwrap(member)[1]]
    description = next((m.description for m in reversed(metas) if m.description), None)
    if what.startswith("Expected `str` matching regex") and description:
        return f"must be {description}"
    if "RFC3339" in what:
        return "expected a date-time such as 2027-01-31T00:00:00Z (UTC when it has no offset)"
    length = re.fullmatch(r"Expected `(?:str|array)` of length (>=|<=) (\d+)", what)
    if length:
        return f"must have {_BOUND[length[1]]} {length[2]} {'character' if 'str' in what else 'item'}(s)"
    return what
