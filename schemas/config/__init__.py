"""Typed configuration: frozen msgspec structs decoded from TOML plus ``RERANK_*`` overrides.

Every struct forbids unknown fields so a typo fails at start with the field's path. A model
entry is a tagged union on ``engine``: the engine kind is a type, never a free string that code
compares against. Loading (file, env, defaults) lives in ``gateway.config.settings``.

One module per concern: ``base`` (defaults, shared types, ``ModelConfig``), ``families``
(which family runs on which runtime), ``server`` (the gateway's own tables), ``local``, ``gated``
(the in-process ones whose reduced precision a parity gate admits), ``upstream`` and ``hosted``
(the engine kinds), ``settings`` (the whole file and the engine union). Importers
keep using ``schemas.config``: every name is re-exported here.
"""

from __future__ import annotations

from .base import (
    DEFAULT_INSTRUCTION,
    DEFAULT_MODEL_NAME,
    DEFAULT_MODEL_PATH,
    FamilyName,
    ModelConfig,
    ModelName,
    Positive,
    PositiveFloat,
)
from .cascade import CascadeEngineConfig, CascadeStage
from .families import (
    FAMILY_RUNTIMES,
    LLM_RERANKERS,
    PACKED_ENCODER_TYPES,
    RUNTIME_REFUSALS,
    LlmRerankerSpec,
    packed_encoder_refusal,
    packed_runs_checkpoint,
    runtime_refusal,
)
from .gated import (
    PARITY_MIN_AGREEMENT,
    PARITY_TIE,
    PARITY_TOP_K,
    GatedPrecisionConfig,
    OpenVinoEngineConfig,
    PackedEngineConfig,
    TransformersEngineConfig,
)
from .hosted import (
    BedrockEngineConfig,
    CohereEngineConfig,
    HostedRerankConfig,
    JinaEngineConfig,
    MixedbreadEngineConfig,
    NvidiaEngineConfig,
    TogetherEngineConfig,
    VoyageEngineConfig,
)
from .local import (
    GgufEngineConfig,
    LocalModelConfig,
    Qwen3LocalConfig,
    StaticEngineConfig,
    VllmEngineConfig,
    VllmGenerateEngineConfig,
    VllmScoreEngineConfig,
)
from .references import ComposedModelConfig, ModelReferenceError, check_references
from .routing import ChainEngineConfig
from .server import (
    ApiKeyConfig,
    AuthConfig,
    CacheConfig,
    DialectsConfig,
    KeyHash,
    KeyId,
    LimitsConfig,
    LoggingConfig,
    ServerConfig,
)
from .settings import EngineConfig, Settings
from .upstream import DashScopeEngineConfig, PoolEngineConfig, UpstreamHttpConfig

__all__ = (
    "DEFAULT_INSTRUCTION",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_PATH",
    "FAMILY_RUNTIMES",
    "LLM_RERANKERS",
    "PACKED_ENCODER_TYPES",
    "PARITY_MIN_AGREEMENT",
    "PARITY_TIE",
    "PARITY_TOP_K",
    "RUNTIME_REFUSALS",
    "ApiKeyConfig",
    "AuthConfig",
    "BedrockEngineConfig",
    "CacheConfig",
    "CascadeEngineConfig",
    "CascadeStage",
    "ChainEngineConfig",
    "CohereEngineConfig",
    "ComposedModelConfig",
    "DashScopeEngineConfig",
    "DialectsConfig",
    "EngineConfig",
    "FamilyName",
    "GatedPrecisionConfig",
    "GgufEngineConfig",
    "HostedRerankConfig",
    "JinaEngineConfig",
    "KeyHash",
    "KeyId",
    "LimitsConfig",
    "LlmRerankerSpec",
    "LocalModelConfig",
    "LoggingConfig",
    "MixedbreadEngineConfig",
    "ModelConfig",
    "ModelName",
    "ModelReferenceError",
    "NvidiaEngineConfig",
    "OpenVinoEngineConfig",
    "PackedEngineConfig",
    "PoolEngineConfig",
    "Positive",
    "PositiveFloat",
    "Qwen3LocalConfig",
    "ServerConfig",
    "Settings",
    "StaticEngineConfig",
    "TogetherEngineConfig",
    "TransformersEngineConfig",
    "UpstreamHttpConfig",
    "VllmEngineConfig",
    "VllmGenerateEngineConfig",
    "VllmScoreEngineConfig",
    "VoyageEngineConfig",
    "check_references",
    "packed_encoder_refusal",
    "packed_runs_checkpoint",
    "runtime_refusal",
)
