"""Checks of a model's config against its checkpoint, shared by every local engine.

Standard library only (and ``adapters.base``): ``rerank-gateway check-config`` runs them on a local checkpoint
directory without importing torch, transformers or vLLM; the engines run them again at start
(on a hub checkpoint too, with the config transformers resolved).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from adapters.base import EngineConfigError

__all__ = (
    "CheckpointMismatchError",
    "cached_hub_config",
    "check_window",
    "is_hub_id",
    "local_checkpoint_config",
    "missing_local_path",
)

# A Hugging Face repo id: "name" or "namespace/name", letters, digits, '-', '_', '.', at most 96
# characters a part (huggingface_hub's validate_repo_id, minus its rarer rules).
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


class CheckpointMismatchError(EngineConfigError):
    """The model's config asks for something its checkpoint cannot do; the message says what to set."""


def local_checkpoint_config(path: str) -> dict[str, Any] | None:
    """``config.json`` of a local checkpoint directory, or None (a hub id, or no such file)."""
    file = Path(path) / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cached_hub_config(repo: str, revision: str | None = None) -> dict[str, Any] | None:
    """``config.json`` of hub id ``repo`` from the local Hugging Face cache only, or None.

    Config-time choices (the default engine) must not reach the network; a checkpoint already
    downloaded (the usual case for an offline GPU box) is read as a local directory would be.
    """
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # a cloud-only install (no transformers): nothing is cached locally anyway
        return None
    try:
        file = try_to_load_from_cache(repo, "config.json", revision=revision)
    except Exception:  # noqa: BLE001  # a malformed id or cache: treated as not cached
        return None
    if not isinstance(file, str):  # None (not cached) or the "known missing" marker
        return None
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_hub_id(path: str) -> bool:
    """``path`` names no file or directory here and reads as a hub repo id (downloaded at start)."""
    return not os.path.exists(path) and _HUB_ID.fullmatch(path) is not None and ".." not in path and "--" not in path


def missing_local_path(path: str) -> bool:
    """``path`` is meant as a local path (it cannot be a hub repo id) and does not exist here.

    ``/models/qwen``, ``./qwen``, ``~/qwen`` or ``a/b/c`` can only be local; ``org/name``
    could be either and counts as a hub id until it exists as a directory.
    """
    return not os.path.exists(path) and not is_hub_id(path)


def check_window(model: str, max_length: int, max_positions: int | None, *, extra_tokens: int = 0) -> None:
    """Raise when ``max_length`` (+ tokens the runner adds) exceeds ``max_position_embeddings``.

    vLLM refuses such a window deep inside its start with a multi-line validation error; the
    transformers engine would score positions the model was never trained on.
    """
    if max_positions is None or max_length + extra_tokens <= max_positions:
        return
    plus = f" + {extra_tokens} generated token" if extra_tokens else ""
    raise CheckpointMismatchError(
        f"model {model!r}: max_length {max_length}{plus} is larger than the checkpoint's "
        f"max_position_embeddings {max_positions}; set max_length to at most {max_positions - extra_tokens}"
    )
