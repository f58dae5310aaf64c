"""MkDocs hook: the pages that must not drift from the code are generated when the site is built.

- ``reference/configuration.md`` walks the msgspec structs of ``schemas/config/`` (every key,
  its type with constraints, its default) and takes each key's meaning from the comment above or
  beside it in its module, so a key added there is in the reference without anyone writing it
  (``docs/hooks/config_reference.py``).
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

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # mkdocs loads hooks by path; the project may not be installed
    sys.path.insert(0, str(ROOT))

from docs.hooks.config_reference import _cell, config_reference_markdown
from schemas import config as cfg

CONFIG_PAGE = "reference/configuration.md"
HTTP_PAGE = "reference/http.md"

# ---------------------------------------------------------------------------------------------
# HTTP reference


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


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
