"""What every config module shares: the defaults, the constrained scalar types, ``_Strict``
and ``ModelConfig`` (the base of every ``[[models]]`` entry, tagged on ``engine``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

DEFAULT_MODEL_PATH = "Qwen/Qwen3-Reranker-0.6B"
DEFAULT_MODEL_NAME = "qwen3-reranker-0.6b"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
# Request bodies bound their `model` by the same length (schemas.rerank): no longer name can
# match, and a longer one would otherwise be echoed whole in the 404 and the access log.
MODEL_NAME_MAX_LENGTH = 256
# `description` is also what a config error says the value must be (gateway.config.config_schema).
ModelName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MODEL_NAME_MAX_LENGTH,
        pattern=r"^[^\s]+\Z",  # \Z: `$` also matches before a final line break
        description="a name without spaces, tabs or line breaks (e.g. qwen3-reranker-0.6b)",
    ),
]


class _Strict(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    pass


class ModelConfig(_Strict, tag_field="engine", frozen=True):
    """Fields every engine kind shares."""

    name: ModelName  # the public model name clients send (no spaces)
    # More names for the same model (e.g. "rerank-v3.5" for clients that send a fixed name).
    aliases: tuple[ModelName, ...] = ()
    timeout_s: PositiveFloat = 60.0  # engine (or upstream) time per request; then 504
    # Requests admitted to this model at once (running + waiting); more get 503 + Retry-After.
    max_concurrent_requests: Positive = 256


FamilyName = Literal[
    "auto", "qwen3", "bge-reranker-v2-gemma", "mxbai-rerank-v2", "cross-encoder", "bi-encoder", "jina-v3"
]
