"""Model families: how a (query, document) pair becomes tokens and a model output becomes a score.

A family knows its prompt or input layout and its score rule (Qwen3's yes/no prompt; a
cross-encoder's pair with one logit and an activation; a bi-encoder's two embeddings and a
cosine; Jina v3's listwise call). It knows nothing about where the model runs: that is a
runtime's job (``adapters.runtimes``). A new model kind goes here: a module with one
:class:`adapters.families.base.Family` subclass, a line in ``FAMILIES`` below, a detection rule
in ``detect.py`` and its runtimes in ``schemas.config.FAMILY_RUNTIMES``. A causal-LM reranker
(a prompt and one or two score tokens) is a preset instead: an ``LlmRerankerSpec`` in
``schemas.config.LLM_RERANKERS`` and a three-line subclass in ``llm.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

import structlog

from adapters.families.detect import Detection, ModelFiles, resolve_family

if TYPE_CHECKING:
    from adapters.families.base import Family
    from schemas.config import LocalModelConfig

__all__ = ("FAMILIES", "create_family", "load_family_class", "resolve_for_runtime")

log = structlog.get_logger("adapters.families")

# family name -> "module:Class"; imported only when a model of that family starts (torch).
FAMILIES: Final[dict[str, str]] = {
    "qwen3": "adapters.families.qwen3:Qwen3Family",
    "bge-reranker-v2-gemma": "adapters.families.llm:BgeGemmaFamily",
    "mxbai-rerank-v2": "adapters.families.llm:MxbaiV2Family",
    "cross-encoder": "adapters.families.cross_encoder:CrossEncoderFamily",
    "bi-encoder": "adapters.families.bi_encoder:BiEncoderFamily",
    "jina-v3": "adapters.families.jina_v3:JinaV3Family",
}


def load_family_class(name: str) -> type[Family]:
    module_name, _, class_name = FAMILIES[name].partition(":")
    cls: type[Family] = getattr(importlib.import_module(module_name), class_name)
    return cls


def resolve_for_runtime(config: LocalModelConfig, runtime: str) -> tuple[Detection, ModelFiles]:
    """Resolve (``auto``: detect) the configured model's family; ValueError unless ``runtime`` runs it.

    Blocking (reads the checkpoint's JSON files): call from a worker thread.
    """
    from schemas.config import FAMILY_RUNTIMES, RUNTIME_REFUSALS

    detection, files = resolve_family(config.family, config.path, config.revision)
    runtimes = FAMILY_RUNTIMES.get(detection.family, frozenset())
    if runtime not in runtimes:
        why = RUNTIME_REFUSALS.get((detection.family, runtime))
        raise ValueError(
            f"'{config.path}' is a {detection.family} model ({detection.reason}), which engine "
            f"{runtime!r} cannot run{f' ({why})' if why else ''}; use engine = one of {', '.join(sorted(runtimes))}"
        )
    return detection, files


def create_family(config: LocalModelConfig, runtime: str) -> Family:
    """Resolve the configured model's family, check ``runtime`` runs it, build it (worker thread)."""
    detection, files = resolve_for_runtime(config, runtime)
    cls = load_family_class(detection.family)
    if config.raw_scores and not cls.supports_raw_scores:
        raise ValueError(f"raw_scores = true: the {detection.family} family has no raw output; remove it")
    log.info(
        "model_family",
        model=config.name,
        family=detection.family,
        reason=detection.reason,
        runtime=runtime,
    )
    return cls(config, files, detection)
