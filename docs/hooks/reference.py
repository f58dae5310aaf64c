"""MkDocs hook: the pages that must not drift from the code are generated when the site is built.

- ``reference/configuration.md`` walks the msgspec structs of ``schemas/config/`` (every key,
  its type with constraints, its default) and takes each key's meaning from the comment above or
  beside it in its module, so a key added there is in the reference without anyone writing it.
- ``reference/http.md`` renders the app's own OpenAPI document (``gateway.app.create_app``, the
  same document ``/schema/openapi.json`` serves).
- ``index.md`` is the README with its ``docs/`` links made relative to the site.

``tests/test_docs.py`` imports this module to check the reference against the structs and builds
the site with ``mkdocs build --strict``. Run by itself it prints a page
(``.venv/bin/python docs/hooks/reference.py config|http``) or, with ``write``, refreshes the
copies committed under ``docs/reference/`` so that the pages read on GitHub too (the site
regenerates them; a test fails while the committed copies are stale).
"""

from __future__ import annotations

import ast
import io
import json
import re
import sys
import tokenize
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # mkdocs loads hooks by path; the project may not be installed
    sys.path.insert(0, str(ROOT))

from schemas import config as cfg

CONFIG_PAGE = "reference/configuration.md"
HTTP_PAGE = "reference/http.md"

# ---------------------------------------------------------------------------------------------
# Configuration reference


def _field_comments() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the comment lines above the field plus its trailing comment,
    read from every module of the ``schemas.config`` package (class names are unique across them)."""
    out: dict[tuple[str, str], str] = {}
    for path in sorted(Path(cfg.__file__).parent.glob("*.py")):
        for key, text in _module_field_comments(path.read_text()).items():
            if key in out:
                raise ValueError(f"class {key[0]} is defined twice in schemas/config/ ({path.name} and another)")
            out[key] = text
    return out


def _module_field_comments(source: str) -> dict[tuple[str, str], str]:
    """One module's (class name, field name) -> comment, as :func:`_field_comments` describes."""
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].strip() != tok.string.strip():
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above: list[str] = []
            n = stmt.lineno - 2  # 0-based index of the line above
            while n >= 0 and lines[n].strip().startswith("#"):
                above.insert(0, lines[n].strip().lstrip("#").strip())
                n -= 1
            beside = [trailing[i] for i in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if i in trailing]
            parts = [" ".join(p for p in above if p), " ".join(p for p in beside if p)]
            out[(node.name, stmt.target.id)] = _sentences(p for p in parts if p)
    return out


# A source path or module (`adapters/runtimes/parity.py`, `gateway.launch.servers`): the comments
# are written beside the code, for its readers; the reference is for people configuring the gateway.
_MODULE = r"(?:(?<![\w-])(?:(?:gateway|adapters|schemas|benchmarks|tests)[./]|docs/(?!s\b))[\w./-]*\w)"
_BARE_MODULE = re.compile(rf"\s*(?:see\s+)?`?{_MODULE}`?(?:,\s*|;\s*)?")
# A docs page named in a comment becomes a link to it (from reference/, one folder down).
_DOCS_PAGE = re.compile(r"`?\bdocs/([\w-]+)\.md(#[\w-]+)?`?")


def _docs_link(m: re.Match[str]) -> str:
    """A link to a page of this site, or nothing where the page does not exist (yet)."""
    page = m.group(1)
    if not (ROOT / "docs" / f"{page}.md").is_file():
        return ""
    return f"[{page.replace('-', ' ')}](../{page}.md{m.group(2) or ''})"


def for_users(text: str) -> str:
    """A code comment as a reference meaning: source paths dropped (tests/test_docs.py checks none
    is left), with the parentheses they leave empty; docs pages made links."""
    text = _DOCS_PAGE.sub(_docs_link, text)
    text = _BARE_MODULE.sub("", text)
    text = re.sub(r"\s*\(\s*\)", "", text)
    text = re.sub(r"\(\s+", "(", text)
    return re.sub(r"[,;]?\s*\)", ")", text).strip()


def _sentences(parts: Iterable[str]) -> str:
    """Comment lines joined; a part after a finished sentence starts with a capital."""
    out = ""
    for part in parts:
        if out.endswith((".", ":")) and part[:1].islower() and not part.startswith(("e.g.", "i.e.")):
            part = part[:1].upper() + part[1:]
        out = f"{out} {part}" if out else part
    return out


def field_doc(cls: type, name: str, comments: dict[tuple[str, str], str] | None = None) -> str:
    """The comment of ``name`` where ``cls`` or the nearest base declaring it defines it."""
    comments = _field_comments() if comments is None else comments
    for klass in cls.__mro__:
        if (klass.__name__, name) in comments:
            return for_users(comments[(klass.__name__, name)])
    return ""


# Each pattern of schemas/config/ in words (a reader of the reference should not decode regexes);
# tests/test_docs.py fails on a pattern missing here.
PATTERN_WORDS = {
    r"^[^\s]+\Z": "no spaces",
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z": "letters, digits, `.`, `_` and `-`, starting with a letter or digit",
    r"^sha256:[0-9a-f]{64}\Z": "`sha256:` and 64 lowercase hex digits",
}


def _constraints(t: Any, unit: str = "characters") -> list[str]:
    out = []
    for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
        value = getattr(t, attr, None)
        if value is not None:
            out.append(f"{sym} {value}")
    low, high = getattr(t, "min_length", None), getattr(t, "max_length", None)
    if low is not None and high is not None:
        out.append(f"{low}–{high} {unit}")
    elif low is not None:
        out.append(f"at least {low} {unit if low != 1 else unit.rstrip('s')}")
    elif high is not None:
        out.append(f"at most {high} {unit}")
    pattern = getattr(t, "pattern", None)
    if pattern:
        out.append(PATTERN_WORDS.get(pattern, f"matching `{pattern}`"))
    return out


def type_text(t: msgspec.inspect.Type) -> str:
    """A TOML-reader's name for a msgspec type, constraints included."""
    mi = msgspec.inspect
    if isinstance(t, mi.Metadata):
        return type_text(t.type)
    if isinstance(t, mi.UnionType):
        parts = [type_text(x) for x in t.types if not isinstance(x, mi.NoneType)]
        return " or ".join(parts) + (" or none" if t.includes_none else "")
    if isinstance(t, mi.LiteralType):
        return " or ".join(f"`{json.dumps(v)}`" for v in t.values)
    if isinstance(t, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        return f"list of {type_text(t.item_type)}" + "".join(f", {c}" for c in _constraints(t, "items"))
    if isinstance(t, mi.DictType):
        return f"table of {type_text(t.key_type)} to {type_text(t.value_type)}"
    if isinstance(t, mi.StructType):
        return f"`{t.cls.__name__}`"
    names = {
        mi.IntType: "integer",
        mi.FloatType: "number",
        mi.StrType: "string",
        mi.BoolType: "boolean",
        mi.DateTimeType: "datetime",
        mi.AnyType: "any",
        mi.NoneType: "none",
    }
    base = names.get(type(t), type(t).__name__)
    cons = _constraints(t)
    return base + (f" ({', '.join(cons)})" if cons else "")


def default_text(field: msgspec.inspect.Field) -> str:
    if field.required:
        return "required"
    value = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
    return f"`{_toml(value)}`" if value is not None else "none"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, int) and value >= 10_000:
        return f"{value:_}"  # TOML allows 16_384 as Python does
    return repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def struct_table(cls: type, comments: dict[tuple[str, str], str], skip: tuple[str, ...] = ()) -> list[str]:
    rows = ["| Key | Type | Default | Meaning |", "|---|---|---|---|"]
    for field in msgspec.inspect.type_info(cls).fields:
        if field.name in skip:
            continue
        rows.append(
            f"| `{field.name}` | {_cell(type_text(field.type))} | {_cell(default_text(field))} "
            f"| {_cell(field_doc(cls, field.name, comments))} |"
        )
    return rows


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    return for_users(re.sub(r"\s+", " ", doc).strip().replace("``", "`"))


def sections() -> list[tuple[str, str, type]]:
    """(TOML header, environment prefix, struct) for every table of the file, models last."""
    out = []
    for field in msgspec.inspect.type_info(cfg.Settings).fields:
        t = field.type
        if isinstance(t, msgspec.inspect.StructType):
            out.append((f"[{field.name}]", f"RERANK_{field.name.upper()}__", t.cls))
    out.append(("[[auth.keys]]", "RERANK_AUTH__KEYS__<i>__", cfg.ApiKeyConfig))
    return out


def engine_classes() -> list[type]:
    """The model entry's tagged union, in the order of ``EngineConfig``."""
    models = next(f for f in msgspec.inspect.type_info(cfg.Settings).fields if f.name == "models")
    union = models.type.item_type
    return [t.cls for t in union.types]


def config_reference_markdown() -> str:
    comments = _field_comments()
    out = [
        "# Configuration reference",
        "",
        "Generated from `schemas/config/` (`docs/hooks/reference.py`): every key the gateway reads, its",
        "type and default, and the comment written beside it in the code. How the file is found and",
        "how the environment overrides it: [Configuration](../configuration.md).",
        "",
        "A key is overridden from the environment by its path in capitals, segments joined by `__`",
        "and list items by their index (`RERANK_SERVER__PORT=9000`, `RERANK_MODELS__0__PATH=/models/qwen`);",
        "lists and tables are given as JSON.",
        "",
    ]
    for header, env, cls in sections():
        out += [f"## `{header}`", ""]
        if _doc(cls):
            out += [_doc(cls), ""]
        out += [f"Environment: `{env}<KEY>`.", ""]
        out += struct_table(cls, comments)
        out.append("")
    out += [
        "## `[[models]]`",
        "",
        "One entry per public model name; `engine` (required) selects the kind of entry, and with it",
        "the keys it accepts: " + ", ".join(f'`"{c.__struct_config__.tag}"`' for c in engine_classes()) + ".",
        "Environment: `RERANK_MODELS__<i>__<KEY>`.",
        "",
    ]
    for cls in engine_classes():
        tag = cls.__struct_config__.tag
        out += [f'### `engine = "{tag}"`', ""]
        if _doc(cls):
            out += [_doc(cls), ""]
        out += struct_table(cls, comments, skip=())
        out.append("")
    return "\n".join(out)


def config_keys() -> set[str]:
    """Every documented key as ``section.key`` (``models.<engine>.key``), for the tests."""
    keys = {f"{h.strip('[]')}.{f.name}" for h, _, c in sections() for f in msgspec.inspect.type_info(c).fields}
    for cls in engine_classes():
        keys |= {f"models.{cls.__struct_config__.tag}.{f.name}" for f in msgspec.inspect.type_info(cls).fields}
    return keys


# ---------------------------------------------------------------------------------------------
# HTTP reference


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the default configuration's app serves at ``/schema/openapi.json``."""
    from gateway.app import create_app

    settings = cfg.Settings(models=(cfg.TransformersEngineConfig(name=cfg.DEFAULT_MODEL_NAME),))
    app = create_app(settings, configure_logs=False)
    # The dict the app serves (gateway.http.openapi edits it in place once the app is built).
    return app.plugins.get("OpenAPIPlugin").provide_openapi_schema()


def _schema_type(node: dict[str, Any]) -> str:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        return f"[`{name}`](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " or ".join(_schema_type(x) for x in node[key])
    if "enum" in node:
        return " or ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    kind = node.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array":
        text = f"array of {_schema_type(node.get('items', {}))}"
    elif kind == "object" and "additionalProperties" in node and isinstance(node["additionalProperties"], dict):
        text = f"object of {_schema_type(node['additionalProperties'])}"
    else:
        text = kind
    cons = []
    for key, sym in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
        if key in node:
            cons.append(f"{sym} {node[key]}")
    for key, word in (
        ("minItems", "at least {} items"),
        ("maxItems", "at most {} items"),
        ("minLength", "at least {} characters"),
        ("maxLength", "at most {} characters"),
    ):
        if key in node:
            cons.append(word.format(node[key]))
    if "pattern" in node:
        cons.append(f"matching `{node['pattern']}`")
    return text + (f" ({', '.join(cons)})" if cons else "")


def http_reference_markdown(doc: dict[str, Any] | None = None) -> str:
    doc = openapi_document() if doc is None else doc
    info = doc.get("info", {})
    out = [
        "# HTTP reference",
        "",
        f"Generated (`docs/hooks/reference.py`) from the OpenAPI document of the app itself ({info.get('title')}",
        f"{info.get('version')}, default configuration), the one every running gateway serves at",
        "`/schema/openapi.json` (Swagger UI at `/schema/swagger`). The narrative with examples:",
        "[HTTP API](../api.md); other request bodies: [Dialects](../dialects.md).",
        "",
    ]
    # Sorted: the document's own path order is not stable from one app build to the next.
    ops = sorted(
        (method, path, op)
        for path, item in doc.get("paths", {}).items()
        for method, op in item.items()
        if method in ("get", "post", "put", "delete", "patch")
    )

    def rows(op: dict[str, Any]) -> list[tuple[str, str, str]]:
        out_rows = []
        for status, resp in op.get("responses", {}).items():
            content = resp.get("content", {})
            schema = next(iter(content.values()), {}).get("schema") if content else None
            out_rows.append(
                (status, _cell(_flat(resp.get("description", ""))), _cell(_schema_type(schema)) if schema else "")
            )
        return out_rows

    # A status that means the same on several routes is written once, in the table below; a route
    # lists its statuses and writes out only those of its own (the rerank routes share 14).
    seen: dict[tuple[str, str], int] = {}
    for _, _, op in ops:
        for status, meaning, _ in rows(op):
            seen[(status, meaning)] = seen.get((status, meaning), 0) + 1
    shared = sorted((k for k, n in seen.items() if n > 1 and not k[0].startswith("2")), key=lambda k: k[0])
    out += [
        "## Statuses",
        "",
        "What a status means on every route that answers it (each route below lists the ones it can",
        "answer; the body of an error is the route's error schema).",
        "",
        "| Status | Meaning |",
        "|---|---|",
    ]
    out += [f"| {status} | {meaning} |" for status, meaning in shared]
    out += ["", "## Routes", ""]
    first_of: dict[str, str] = {}
    for method, path, op in ops:
        anchor = re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")
        out += [f"### `{method.upper()} {path}` {{#{anchor}}}", ""]
        key = json.dumps({k: v for k, v in op.items() if k != "operationId"}, sort_keys=True, default=str)
        if key in first_of:
            out += [f"The same as [{first_of[key]}](#{first_of[key + '#']}): another path to the same handler.", ""]
            continue
        first_of[key], first_of[key + "#"] = f"`{method.upper()} {path}`", anchor
        text = op.get("description") or op.get("summary") or ""
        if text:
            out += [re.sub(r"\s+", " ", text).strip(), ""]
        body = op.get("requestBody", {}).get("content", {})
        for ctype, media in body.items():
            out += [f"Request body (`{ctype}`): {_schema_type(media.get('schema', {}))}.", ""]
        params = op.get("parameters", [])
        if params:
            out += ["| Parameter | In | Type | Required |", "|---|---|---|---|"]
            for p in params:
                out.append(
                    f"| `{p['name']}` | {p.get('in', '')} | {_cell(_schema_type(p.get('schema', {})))} | "
                    f"{'yes' if p.get('required') else 'no'} |"
                )
            out.append("")
        own = [(s, m, b) for s, m, b in rows(op) if (s, m) not in shared or s.startswith("2")]
        common = sorted((s, b) for s, m, b in rows(op) if (s, m) in shared and not s.startswith("2"))
        if own:
            out += ["| Status | Meaning | Body |", "|---|---|---|"]
            out += [f"| {s} | {m} | {b} |" for s, m, b in own]
            out.append("")
        if common:
            bodies = sorted({b for _, b in common if b})
            out += [
                "Errors as in [Statuses](#statuses): "
                + ", ".join(s for s, _ in common)
                + (f"; body {' / '.join(bodies)}." if bodies else "."),
                "",
            ]
    out += ["## Schemas", ""]
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        out += [f"### `{name}` {{#{name.lower()}}}", ""]
        if schema.get("description"):
            out += [re.sub(r"\s+", " ", schema["description"]).strip(), ""]
        props = schema.get("properties")
        if props:
            required = set(schema.get("required", ()))
            out += ["| Field | Type | Required | Meaning |", "|---|---|---|---|"]
            for prop, node in props.items():
                out.append(
                    f"| `{prop}` | {_cell(_schema_type(node))} | {'yes' if prop in required else 'no'} | "
                    f"{_cell(_flat(node.get('description', '')))} |"
                )
            out.append("")
        elif not schema.get("description"):
            out += [_cell(_schema_type(schema)), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The home page


def index_markdown() -> str:
    """The README as the site's home page: its ``docs/`` links point inside the site."""
    text = (ROOT / "README.md").read_text()
    return text.replace("](docs/", "](")


# ---------------------------------------------------------------------------------------------
# MkDocs event


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in (
        (CONFIG_PAGE, config_reference_markdown()),
        (HTTP_PAGE, http_reference_markdown()),
        ("index.md", index_markdown()),
    ):
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=content))
    return files


def generated_pages() -> dict[str, str]:
    """The committed copies under docs/ (readable on GitHub) and what they must hold."""
    return {CONFIG_PAGE: config_reference_markdown() + "\n", HTTP_PAGE: http_reference_markdown() + "\n"}


def main(argv: list[str]) -> int:
    """``config`` / ``http``: print a page; ``write``: refresh the committed copies (after changing
    schemas/config/ or a route; tests/test_docs.py fails while they are stale)."""
    command = argv[1] if len(argv) > 1 else ""
    if command in ("config", "http"):
        print({"config": config_reference_markdown, "http": http_reference_markdown}[command]())
        return 0
    if command == "write":
        for page, text in generated_pages().items():
            (ROOT / "docs" / page).parent.mkdir(parents=True, exist_ok=True)
            (ROOT / "docs" / page).write_text(text)
            print(f"wrote docs/{page}")
        return 0
    print("usage: reference.py config|http|write", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
