"""``family = "auto"``: tell a checkpoint's family from its files, before any weight is read.

Reads ``config.json`` (architectures, id2label) and sentence-transformers' ``modules.json``,
``1_Pooling/config.json``, ``sentence_bert_config.json`` and ``config_sentence_transformers.json``
(both of its layouts: ``adapters.families.st_files``): small JSON files, so ``check-config`` and ``serve`` can decide in
milliseconds and without torch. A local directory is read directly; a hub id is read from the
Hugging Face cache (or fetched, unless ``HF_HUB_OFFLINE``) through ``huggingface_hub``.

The rules are an ordered tuple of plain functions: a new family adds one (before any rule it
must win over) and nothing else changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.families.st_files import BiEncoderPipeline, bi_encoder_pipeline, pooling_module

__all__ = (
    "FAMILY_CHOICES",
    "Detection",
    "FamilyNotDetectedError",
    "ModelFiles",
    "detect_family",
    "read_model_files",
    "resolve_family",
    "st_pipeline",
)

FAMILY_CHOICES = ("qwen3", "cross-encoder", "bi-encoder", "jina-v3")


class FamilyNotDetectedError(ValueError):
    """``family = "auto"`` and no rule matched: the user must name the family."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}; set the model's family to one of {', '.join(FAMILY_CHOICES)}")
        self.what = what

    def for_field(self, field_path: str) -> str:
        """The one-line message naming the config field to set (``models[0].family``)."""
        return f"{self.what}; set {field_path} to one of {', '.join(FAMILY_CHOICES)}"


@dataclass(frozen=True)
class ModelFiles:
    """The small JSON files of a checkpoint that say what it is."""

    path: str
    config: dict[str, Any]
    # sentence-transformers: the module pipeline and the pooling settings (empty when absent).
    modules: list[dict[str, Any]] = field(default_factory=list)
    pooling: dict[str, Any] = field(default_factory=dict)
    # sentence_bert_config.json (max_seq_length: the window the embedding model was trained for).
    sentence_config: dict[str, Any] = field(default_factory=dict)
    # config_sentence_transformers.json (similarity_fn_name, prompts).
    st_config: dict[str, Any] = field(default_factory=dict)

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def num_labels(self) -> int:
        id2label = self.config.get("id2label")
        if isinstance(id2label, dict) and id2label:
            return len(id2label)
        return int(self.config.get("num_labels", 1) or 1)


@dataclass(frozen=True)
class Detection:
    family: str
    reason: str


def read_model_files(path: str, revision: str | None = None) -> ModelFiles:
    """Read config.json (required) and the sentence-transformers files (optional) of ``path``.

    Raises OSError when config.json cannot be found (not a directory, not in the cache, no hub).
    """

    def load(name: str, *, required: bool) -> Any:
        local = Path(path) / name
        if Path(path).is_dir():
            if local.is_file():
                return json.loads(local.read_text())
            if required:
                raise FileNotFoundError(f"{path}: no {name}")
            return None
        return _hub_json(path, name, revision, required=required)

    config = load("config.json", required=True)
    modules = load("modules.json", required=False) or []
    pooling: dict[str, Any] = {}
    module = pooling_module(modules)
    if module is not None:
        pooling = load(f"{module.get('path') or '1_Pooling'}/config.json", required=False) or {}
    sentence_config = (load("sentence_bert_config.json", required=False) or {}) if modules else {}
    st_config = (load("config_sentence_transformers.json", required=False) or {}) if modules else {}
    return ModelFiles(
        path=path,
        config=config,
        modules=list(modules),
        pooling=pooling,
        sentence_config=sentence_config,
        st_config=st_config,
    )


def _hub_json(repo: str, name: str, revision: str | None, *, required: bool) -> Any:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        file = hf_hub_download(repo, name, revision=revision)
    except EntryNotFoundError:
        if required:
            raise FileNotFoundError(f"{repo}: no {name}") from None
        return None
    except LocalEntryNotFoundError as exc:
        # Offline or unreachable: the weights cannot load either; models.py adds the local-dir hint.
        raise FileNotFoundError(f"{repo}: {name} is not in the Hugging Face cache and the hub is unreachable") from exc
    except Exception as exc:
        if required:
            raise OSError(f"{repo}: cannot read {name} ({type(exc).__name__}: {exc})") from exc
        return None
    return json.loads(Path(file).read_text())


# -- rules: (files) -> Detection | None, tried in order --------------------------------------
def _jina_v3(files: ModelFiles) -> Detection | None:
    if "JinaForRanking" in files.architectures:
        return Detection("jina-v3", "config.json architectures has JinaForRanking (listwise, remote code)")
    return None


def _qwen3(files: ModelFiles) -> Detection | None:
    if "Qwen3ForCausalLM" in files.architectures:
        return Detection("qwen3", "config.json architectures has Qwen3ForCausalLM (Qwen3-Reranker yes/no prompt)")
    return None


def _cross_encoder(files: ModelFiles) -> Detection | None:
    for arch in files.architectures:
        if arch.endswith("ForSequenceClassification"):
            return Detection("cross-encoder", f"config.json architectures has {arch} with {files.num_labels} label(s)")
    return None


def _bi_encoder(files: ModelFiles) -> Detection | None:
    if pooling_module(files.modules) is not None:
        # Read the whole pipeline now: one the gateway cannot serve is refused here, naming why.
        pipeline = st_pipeline(files)
        reason = f"sentence-transformers modules.json has a Pooling module ({pipeline.description})"
        return Detection("bi-encoder", reason)
    return None


RULES: tuple[Callable[[ModelFiles], Detection | None], ...] = (_jina_v3, _qwen3, _cross_encoder, _bi_encoder)


def detect_family(files: ModelFiles) -> Detection:
    for rule in RULES:
        found = rule(files)
        if found is not None:
            return found
    archs = ", ".join(files.architectures) or "none"
    raise FamilyNotDetectedError(
        f"cannot tell the model family of '{files.path}' (config.json architectures: {archs}; "
        "no sentence-transformers Pooling module)"
    )


def resolve_family(family: str, path: str, revision: str | None) -> tuple[Detection, ModelFiles]:
    """The family to use for a configured model: as configured, or detected for ``"auto"``."""
    files = read_model_files(path, revision)
    if family != "auto":
        return Detection(family, f"family = {family!r} in the config"), files
    return detect_family(files), files


def st_pipeline(files: ModelFiles, configured_pooling: str = "auto") -> BiEncoderPipeline:
    """A bi-encoder's pipeline (pooling, Normalize, casing) from its sentence-transformers files."""
    return bi_encoder_pipeline(
        files.modules, files.pooling, files.sentence_config, files.st_config, configured_pooling=configured_pooling
    )
