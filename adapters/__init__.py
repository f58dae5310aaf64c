"""Engines and upstreams behind one small async protocol (see ``adapters.base``)."""

from adapters.base import (
    EngineError,
    EngineInputError,
    EngineOverloadedError,
    EngineTimeoutError,
    EngineUnavailableError,
    PromptTokenizer,
    RerankEngine,
    ScoreJob,
    ScoreResult,
)

__all__ = (
    "EngineError",
    "EngineInputError",
    "EngineOverloadedError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "PromptTokenizer",
    "RerankEngine",
    "ScoreJob",
    "ScoreResult",
)
