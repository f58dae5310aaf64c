"""Why a model failed to load, in the gateway's words: the ``fix`` of ``/ready`` and of the 503.

The cause itself (``describe_exception``) is the libraries' text; the fix must match it: a
mistyped local path is not a network problem, an unreachable hub is not a wrong path, a
directory without ``config.json`` is not a download failure. The fix is safe for a response
body (gateway-written, no exception text).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from adapters.base import EngineConfigError
from adapters.families.checkpoint import is_hub_id, missing_local_path
from adapters.families.hub import HubUnreachableError, offline_mode
from adapters.registry import MissingExtraError
from schemas.config import EngineConfig

__all__ = ("fix_for", "is_network_failure")

# Exception types (by name: their libraries are optional) that mean the hub could not be reached.
_NETWORK_TYPES = frozenset(
    {
        "HubUnreachableError",
        "LocalEntryNotFoundError",
        "OfflineModeIsEnabled",
        "ConnectionError",
        "ConnectError",
        "ConnectTimeout",
        "NewConnectionError",
        "MaxRetryError",
        "NameResolutionError",
        "gaierror",
        "ProxyError",
        "SSLError",
        "ReadTimeout",
        "ConnectTimeoutError",
    }
)
_NETWORK_TEXT = (
    "couldn't connect to",
    "offline mode",
    "hub is unreachable",
    "name resolution",
    "network is unreachable",
    "name or service not known",
    "connection refused",
)
_NOT_ON_HUB_TYPES = frozenset({"RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def is_network_failure(exc: BaseException) -> bool:
    """Somewhere in the cause chain the hub (or any host) could not be reached, or was not asked (offline)."""
    for item in _chain(exc):
        if type(item).__name__ in _NETWORK_TYPES:
            return True
        if any(needle in str(item).lower() for needle in _NETWORK_TEXT):
            return True
    return False


def fix_for(config: EngineConfig, index: int, exc: BaseException) -> str:
    """How to fix the failed load of ``models[index]`` (``config``) that raised ``exc``."""
    from adapters.families.detect import FamilyNotDetectedError

    if isinstance(exc, FamilyNotDetectedError):  # one line naming the field to set
        return exc.for_field(f"models[{index}].family")
    if isinstance(exc, MissingExtraError):
        return exc.hint
    if isinstance(exc, EngineConfigError):
        return str(exc)  # written by the gateway: names the setting and how to fix it
    path = getattr(config, "path", None)
    if not isinstance(path, str):
        return "check the model's config against the cause"
    field = f"models[{index}].path (env RERANK_MODELS__{index}__PATH)"
    if missing_local_path(path):
        return (
            f"'{path}' does not exist on this machine: set {field} to the checkpoint's local directory; "
            "the gateway keeps retrying, so a directory mounted later is picked up"
        )
    if os.path.exists(path) and not os.path.isfile(os.path.join(path, "config.json")):
        return (
            f"'{path}' is not a checkpoint directory (no config.json): set {field} to the directory "
            "that holds config.json and the weights"
        )
    names = {type(item).__name__ for item in _chain(exc)}
    if is_hub_id(path) and is_network_failure(exc):
        # The probe's words where it ran (offline mode, DNS, no connection, an HTTP answer).
        probed = next((item.reason for item in _chain(exc) if isinstance(item, HubUnreachableError)), None)
        why = probed or (
            "HF_HUB_OFFLINE is set, so nothing is downloaded"
            if offline_mode()
            else "the Hugging Face hub cannot be reached from this machine"
        )
        return (
            f"'{path}' is a hub id and it is not in the local Hugging Face cache; {why}. Download it where "
            f"the hub is reachable (hf download {path} --local-dir DIR) and set {field} to that local "
            "directory, or fill the cache (HF_HOME) and restart"
        )
    if is_hub_id(path) and names & _NOT_ON_HUB_TYPES:
        return (
            f"the Hugging Face hub has no model '{path}' this machine may read (a typo, or a private or gated "
            f"repo: set HF_TOKEN); or set {field} to a local directory"
        )
    if isinstance(exc, OSError) or any("huggingface" in n.lower() for n in names):
        return (
            f"could not load weights from '{path}'; if this machine cannot reach the Hugging Face hub, "
            f"download the checkpoint elsewhere and set {field} to its local directory"
        )
    return "check the model's config against the cause"
