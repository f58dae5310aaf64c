"""What produces a model's scores, as one hash: part of every response cache key.

A Redis cache outlives the gateway, so a restart with new weights or new settings behind the
same model name must not be answered from the old entries, while a restart with the same ones
should still hit. The hash covers the model's whole config entry after defaults (engine kind,
path, revision, precision, window, instruction, prompt template, upstream URLs and model ...),
except the fields listed in ``_NOT_SCORING``, plus a stamp of the checkpoint's files (name,
size, modification time): new weights copied over the old directory change it without a
config change. Stamping is a directory listing, not a hash of gigabytes of weights, so it
costs nothing at start; a file rewritten with the same size and mtime would go unnoticed.
An upstream's own weights are out of sight: there the TTL is the only bound.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import msgspec

from schemas.config import EngineConfig

__all__ = ("model_fingerprint",)

# Fields that cannot change a score: naming, time limits, concurrency, connections, retries and
# credentials (rotating an upstream's API key must not empty the cache). Anything not listed
# counts, so a field added later errs towards a miss, never towards a stale answer.
_NOT_SCORING = frozenset(
    {
        "aliases",
        "timeout_s",
        "max_concurrent_requests",
        "delay_s",
        "api_key",
        "api_key_env",
        "connect_timeout_s",
        "read_timeout_s",
        "max_connections",
        "max_parallel_calls",
        "retries",
        "backoff_initial_s",
        "backoff_max_s",
        "eject_after_failures",
        "cooldown_s",
        "health_path",
        "probe_timeout_s",
    }
)

_encode = msgspec.json.Encoder(order="deterministic").encode


def model_fingerprint(config: EngineConfig) -> str:
    """Hex SHA-256 of ``config``'s scoring fields and its checkpoint files as they are now."""
    fields = {k: v for k, v in msgspec.to_builtins(config).items() if k not in _NOT_SCORING}
    path = getattr(config, "path", None)
    try:
        files = _stamp(path, getattr(config, "revision", None)) if isinstance(path, str) else []
    except OSError:  # the files cannot be read now: a key no other process shares, never a stale one
        files = ["unreadable", os.urandom(8).hex()]
    return hashlib.sha256(_encode({"config": fields, "files": files})).hexdigest()


def _stamp(path: str, revision: str | None) -> list[Any]:
    if os.path.isfile(path):  # a .gguf file
        return [_file(path, os.path.basename(path))]
    if not os.path.isdir(path):
        path = _hub_snapshot(path, revision) or ""
        if not path:  # not downloaded yet: the engine will fetch it, the stamp is taken again then
            return []
    out = []
    # The top level and one level down (sentence-transformers' 1_Pooling/, ...); hidden entries
    # (.git, huggingface_hub's .cache) are bookkeeping, not the model.
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            out += [
                _file(sub.path, f"{entry.name}/{sub.name}")
                for sub in sorted(os.scandir(entry.path), key=lambda e: e.name)
                if sub.is_file() and not sub.name.startswith(".")
            ]
        elif entry.is_file():
            out.append(_file(entry.path, entry.name))
    return out


def _file(path: str, name: str) -> list[Any]:
    st = os.stat(path)  # follows the hub cache's symlinks to the blobs
    return [name, st.st_size, st.st_mtime_ns]


def _hub_snapshot(repo: str, revision: str | None) -> str | None:
    """The local snapshot directory of hub id ``repo`` at ``revision``, from the cache only."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # a cloud-only install: no local checkpoints
        return None
    try:
        file = try_to_load_from_cache(repo, "config.json", revision=revision)
    except Exception:  # noqa: BLE001  # a malformed id or cache: nothing to stamp
        return None
    return os.path.dirname(file) if isinstance(file, str) else None
