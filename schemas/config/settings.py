"""The whole file: ``Settings`` and the tagged union of engine configs its ``models`` holds."""

from __future__ import annotations

from .base import _Strict
from .cascade import CascadeEngineConfig
from .gated import OpenVinoEngineConfig, PackedEngineConfig, TransformersEngineConfig
from .hosted import (
    BedrockEngineConfig,
    CohereEngineConfig,
    JinaEngineConfig,
    MixedbreadEngineConfig,
    NvidiaEngineConfig,
    TogetherEngineConfig,
    VoyageEngineConfig,
)
from .local import GgufEngineConfig, StaticEngineConfig, VllmGenerateEngineConfig, VllmScoreEngineConfig
from .routing import ChainEngineConfig
from .server import AuthConfig, CacheConfig, DialectsConfig, LimitsConfig, LoggingConfig, ServerConfig
from .upstream import DashScopeEngineConfig, PoolEngineConfig

EngineConfig = (
    TransformersEngineConfig
    | PackedEngineConfig
    | OpenVinoEngineConfig
    | VllmScoreEngineConfig
    | VllmGenerateEngineConfig
    | StaticEngineConfig
    | DashScopeEngineConfig
    | PoolEngineConfig
    | GgufEngineConfig
    | ChainEngineConfig
    | CascadeEngineConfig
    | CohereEngineConfig
    | JinaEngineConfig
    | VoyageEngineConfig
    | MixedbreadEngineConfig
    | NvidiaEngineConfig
    | TogetherEngineConfig
    | BedrockEngineConfig
)


class Settings(_Strict, frozen=True):
    server: ServerConfig = ServerConfig()
    logging: LoggingConfig = LoggingConfig()
    limits: LimitsConfig = LimitsConfig()
    auth: AuthConfig = AuthConfig()
    dialects: DialectsConfig = DialectsConfig()
    cache: CacheConfig = CacheConfig()
    models: tuple[EngineConfig, ...] = ()
