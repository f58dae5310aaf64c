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

FAMILY_CHOICES = ("qwen3", "cross-encoder", "bi-encoder", "jina-v3", "bge-reranker-v2-gemma", "mxbai-rerank-v2")


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
        # Neither key: transformers' own default, two labels. Its save_pretrained (5.x) leaves the
        # default two-label id2label out of config.json, and from_pretrained builds a 2-row head.
        return int(self.config.get("num_labels", 2) or 2)


@dataclass(frozen=True)
class Detection:
    family: str
    reason: str


def read_model_files(path: str, revision: str | None = None) -> ModelFiles:
    """Read config.json (required) and the sentence-transformers files (optional) of ``path``.

    Raises OSError when config.json cannot be found (not a directory, not in the cache, no hub).
    """
    from adapters.families.checkpoint import missing_local_path

    if missing_local_path(path):  # not a hub id either: asking the hub would only blur the cause
        raise FileNotFoundError(f"{path}: no such directory on this machine")
    if Path(path).exists() and not Path(path).is_dir():
        raise NotADirectoryError(f"{path}: a file, not a checkpoint directory")

    def load(name: str, *, required: bool) -> Any:
        local = Path(path) / name
        if Path(path).is_dir():
            if local.is_file():
                return json.loads(local.read_text())
            if required:
                raise FileNotFoundError(f"{path}: no {name} (not a checkpoint directory)")
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
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    from adapters.families.hub import HubUnreachableError, http_failure, unreachable_reason

    # Probe first: the hub client retries an unreachable host for 23 s before it falls back to the
    # cache, and then cannot tell offline mode from DNS from a firewall (adapters/families/hub.py).
    reason = unreachable_reason()
    if reason is not None:
        cached = try_to_load_from_cache(repo, name, revision=revision)
        if isinstance(cached, str):  # what hf_hub_download would fall back to, without the wait
            return json.loads(Path(cached).read_text())
        if cached is not None and not required:  # the cache knows the repo has no such file
            return None
        raise HubUnreachableError(f"{repo}: {name} is not in the local Hugging Face cache, and {reason}", reason)
    try:
        file = hf_hub_download(repo, name, revision=revision)
    except LocalEntryNotFoundError as exc:  # a subclass of EntryNotFoundError: caught first
        # The probe passed but the download could not reach the hub (a proxy, or it went away).
        why = http_failure(exc) or "the hub could not be reached"
        raise HubUnreachableError(f"{repo}: {name} is not in the local Hugging Face cache, and {why}", why) from exc
    except EntryNotFoundError:
        if required:
            raise FileNotFoundError(f"{repo}: no {name} in the hub repo (not a transformers checkpoint)") from None
        return None
    except Exception as exc:
        if required:  # the cause (its type and text) follows in the chain: not repeated here
            answered = http_failure(exc)
            raise OSError(
                f"{repo}: cannot read {name} from the Hugging Face hub" + (f" ({answered})" if answered else "")
            ) from exc
        return None
    return json.loads(Path(file).read_text())


# -- rules: (files) -> Detection | None, tried in order --------------------------------------
def _jina_v3(files: ModelFiles) -> Detection | None:
    if "JinaForRanking" in files.architectures:
        return Detection("jina-v3", "config.json architectures has JinaForRanking (listwise, remote code)")
    return None


def _qwen3(files: ModelFiles) -> Detection | None:
    # A causal LM saved with a sentence-transformers Pooling module is an embedding model
    # (Qwen3-Embedding, gte-Qwen2...): the bi-encoder rule takes it, never a reranker's prompt.
    if "Qwen3ForCausalLM" in files.architectures and pooling_module(files.modules) is None:
        return Detection("qwen3", "config.json architectures has Qwen3ForCausalLM (Qwen3-Reranker yes/no prompt)")
    return None


# Causal-LM rerankers ship the plain causal-LM architecture: the reranker is the prompt and the
# score tokens. These are the ones whose architecture only a reranker of this gateway's kind uses.
_LLM_RERANKERS = {
    "GemmaForCausalLM": ("bge-reranker-v2-gemma", 'bge-reranker-v2-gemma\'s A/B prompt, the "Yes" logit'),
    "Qwen2ForCausalLM": ("mxbai-rerank-v2", 'mxbai-rerank-v2\'s prompt, logit("1") - logit("0")'),
}


def _llm_reranker(files: ModelFiles) -> Detection | None:
    if pooling_module(files.modules) is not None:
        return None  # an embedding model (see _qwen3)
    for arch in files.architectures:
        if arch in _LLM_RERANKERS:
            family, how = _LLM_RERANKERS[arch]
            return Detection(family, f"config.json architectures has {arch} ({how})")
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


RULES: tuple[Callable[[ModelFiles], Detection | None], ...] = (
    _jina_v3,
    _qwen3,
    _llm_reranker,
    _cross_encoder,
    _bi_encoder,
)


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
