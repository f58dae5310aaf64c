"""Typed configuration: frozen msgspec structs decoded from TOML plus ``RERANK_*`` overrides.

Every struct forbids unknown fields so a typo fails at start with the field's path. A model
entry is a tagged union on ``engine``: the engine kind is a type, never a free string that code
compares against. Loading (file, env, defaults) lives in ``gateway.settings``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = (
    "DEFAULT_INSTRUCTION",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_PATH",
    "EngineConfig",
    "LimitsConfig",
    "LoggingConfig",
    "ModelConfig",
    "Qwen3LocalConfig",
    "ServerConfig",
    "Settings",
    "StaticEngineConfig",
    "TransformersEngineConfig",
)

DEFAULT_MODEL_PATH = "Qwen/Qwen3-Reranker-0.6B"
DEFAULT_MODEL_NAME = "qwen3-reranker-0.6b"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\s]+$")]


class _Strict(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    pass


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    # uvicorn is a hard dependency; granian is faster but optional (extra `granian`).
    runner: Literal["uvicorn", "granian"] = "uvicorn"


class LoggingConfig(_Strict):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "json"


class LimitsConfig(_Strict):
    max_body_bytes: Positive = 20 * 1024 * 1024
    max_documents: Positive = 10_000
    # Cohere caps documents x chunks at 10,000; we cap the chunks actually produced.
    max_total_chunks: Positive = 10_000


class ModelConfig(_Strict, tag_field="engine"):
    """Fields every engine kind shares."""

    name: ModelName
    aliases: tuple[ModelName, ...] = ()
    timeout_s: PositiveFloat = 60.0
    # Requests admitted to this model at once (running + waiting); more get 503 + Retry-After.
    max_concurrent_requests: Positive = 256


class Qwen3LocalConfig(ModelConfig):
    """A Qwen3-Reranker checkpoint scored in-process: the gateway tokenizes and templates."""

    path: str = DEFAULT_MODEL_PATH
    revision: str | None = None
    instruction: str = DEFAULT_INSTRUCTION
    # Tokens per prompt (template + query + one document chunk); longer documents are chunked.
    max_length: Positive = 8192
    # Longer queries are truncated (Cohere truncates queries too).
    max_query_tokens: Positive = 2048
    # Default chunk cap when the request names none (Cohere's OpenAPI default).
    max_chunks_per_doc: Positive = 10


class TransformersEngineConfig(Qwen3LocalConfig, tag="transformers"):
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Padded tokens (longest prompt x rows) per forward pass, and rows per pass.
    batch_tokens: Positive = 16_384
    max_batch_size: Positive = 64
    # Forward passes running at once in worker threads (torch already uses every core).
    max_parallel_batches: Positive = 1


class StaticEngineConfig(ModelConfig, tag="static"):
    """Zero-cost test engine: a fixed score per document, no model. For tests and benchmarks."""

    score: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    # Scores by exact document text; documents not listed get `score`.
    scores: dict[str, Annotated[float, msgspec.Meta(ge=0, le=1)]] = {}
    # Simulated inference time per request (tests of timeouts and overload; latency models).
    delay_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0


EngineConfig = TransformersEngineConfig | StaticEngineConfig


class Settings(_Strict):
    server: ServerConfig = ServerConfig()
    logging: LoggingConfig = LoggingConfig()
    limits: LimitsConfig = LimitsConfig()
    models: tuple[EngineConfig, ...] = ()
