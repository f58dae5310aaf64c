"""Models made of other configured models (a fallback ``chain``, a ``cascade``), and the one check of
the names they give.

Such an entry has no engine of its own: it names other ``[[models]]`` entries, which load and
serve as usual, and the gateway routes its requests to them (``gateway.serving.routing``). Every
kind of it subclasses :class:`ComposedModelConfig` and lists the names it gives in
:meth:`ComposedModelConfig.references`; :func:`check_references` then checks them all at load, in
one place, whatever the kind: each name is a configured model or alias, no entry names itself,
no entry reaches itself through others (a cycle would route a request forever), and no chain
reaches one model twice through chains it names (a request would try that model twice, and its
failures would count twice towards its ejection).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import ModelConfig

__all__ = ("ComposedModelConfig", "ModelReferenceError", "check_references")


class ComposedModelConfig(ModelConfig, frozen=True):
    """Base of ``[[models]]`` entries made of other configured models; no engine is loaded for them."""

    def references(self) -> tuple[tuple[str, str], ...]:
        """``(field path, model name)`` for every other model this entry names, e.g. ``("targets[0]", "local")``."""
        raise NotImplementedError


class ModelReferenceError(ValueError):
    """A composed model names a model that is not configured, itself, or a cycle; ``path`` is where."""

    def __init__(self, message: str, path: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.path = path


def check_references(models: Sequence[ModelConfig]) -> dict[str, tuple[str, ...]]:
    """Check every :class:`ComposedModelConfig` in ``models``; return each one's canonical names in order.

    Aliases are resolved: a chain may name a target by its alias, and gets the canonical name
    back. Raises :class:`ModelReferenceError` naming ``models[i].<field>`` and what is wrong.
    """
    canonical = {name: m.name for m in models for name in (m.name, *m.aliases)}
    kinds = {m.name: str(type(m).__struct_config__.tag) for m in models}
    graph: dict[str, tuple[str, ...]] = {}
    where: dict[str, int] = {}
    for i, model in enumerate(models):
        if not isinstance(model, ComposedModelConfig):
            continue
        kind = type(model).__struct_config__.tag
        names: list[str] = []
        for field, name in model.references():
            path = ("models", i, *_split(field))
            target = canonical.get(name)
            if target is None:
                raise ModelReferenceError(
                    f"models[{i}].{field}: {name!r} is not a configured model name or alias "
                    f"(configured: {', '.join(sorted(canonical))})",
                    path,
                )
            if target == model.name:
                raise ModelReferenceError(f"models[{i}].{field}: {kind} {model.name!r} names itself", path)
            if kind == "chain" and kinds[target] == "cascade":
                # A chain tries one engine per target; a cascade has none (it runs other models'):
                # every attempt would be "not ready" while the chain reported itself ready.
                raise ModelReferenceError(
                    f"models[{i}].{field}: {name!r} is a cascade, which a chain cannot try; chain its "
                    "stages' models instead (a cascade's stage may be a chain)",
                    path,
                )
            if target in names:
                raise ModelReferenceError(
                    f"models[{i}].{field}: {name!r} names {target!r} a second time (each is used at most once)", path
                )
            names.append(target)
        graph[model.name] = tuple(names)
        where[model.name] = i
    for start in graph:
        cycle = _cycle(start, graph)
        if cycle:
            i = where[start]
            raise ModelReferenceError(
                f"models[{i}] ({start}): names form a cycle ({' -> '.join(cycle)}); a request would be routed forever",
                ("models", i),
            )
    for start, i in where.items():
        if kinds[start] == "chain":
            _reached_once(start, i, graph, kinds)
    return graph


def _reached_once(chain: str, i: int, graph: dict[str, tuple[str, ...]], kinds: dict[str, str]) -> None:
    """Refuse a chain that reaches one model along two paths of nested chains (graphs are acyclic here)."""
    via: dict[str, str] = {}

    def walk(node: str, path: str) -> None:
        for target in graph.get(node, ()):
            here = f"{path} -> {target}"
            if target in via:
                raise ModelReferenceError(
                    f"models[{i}] ({chain}): reaches {target!r} twice ({via[target]}; {here}); a request "
                    "would try it twice: name it once",
                    ("models", i),
                )
            via[target] = here
            if kinds[target] == "chain":
                walk(target, here)

    walk(chain, chain)


def _cycle(start: str, graph: dict[str, tuple[str, ...]]) -> list[str]:
    """A path from ``start`` back to itself through ``graph``, or [] (depth-first; graphs are tiny)."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return []


def _split(field: str) -> tuple[str | int, ...]:
    """``"targets[1]"`` -> ``("targets", 1)``."""
    name, _, rest = field.partition("[")
    return (name, int(rest.rstrip("]"))) if rest else (name,)
