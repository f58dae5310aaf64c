"""Export an encoder family's model to OpenVINO IR once, and keep it in an on-disk cache.

The exported graph is the family's own ``output`` (the same torch code the transformers
runtime runs: a cross-encoder's logits, a bi-encoder's pooled embedding), traced by
``openvino.convert_model`` from the checkpoint's fp32 weights with dynamic batch and length.

A cache entry is a directory named by a key over everything that changes the graph: the
checkpoint's content hash (config.json and weight files), the family's export options (inputs,
pooling, labels), the quantization recipe, and the versions of
OpenVINO, NNCF, torch and transformers. Its ``manifest.json`` records the SHA-256 of each file;
an entry whose files do not match (a crash mid-write, a disk error, a hand edit) is removed and
rebuilt, never loaded. Entries are written to a temporary directory and renamed into place, so
two gateways exporting the same model at once both end with one whole entry. The writer holds a
lock on an owner file in its temporary directory; a start removes the temporary directories whose
lock is free (their writer died, ``kill -9`` included: the kernel drops the lock with the process)
and that nothing wrote to for a minute, and those without an owner file once idle half an hour.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import structlog

try:
    import fcntl
except ImportError:  # not POSIX: temporary directories are judged by age alone
    fcntl = None  # type: ignore[assignment]

__all__ = (
    "EXPORT_VERSION",
    "ModelCache",
    "cache_key",
    "checkpoint_digest",
    "checkpoint_dir",
    "default_cache_dir",
    "hub_patterns",
)

log = structlog.get_logger("adapters.runtimes.cpu")

# Bump when the traced graph or the quantization recipe changes: old entries are then unused.
# 2: models with local (sliding-window) attention layers (ModernBERT) traced with eager attention
# (version 1's SDPA graphs gave NaN for rows padded past half the window).
# 3: BERT-style cross-encoders' last layer for the first token only (graph.py).
EXPORT_VERSION = 3
_XML, _BIN, _MANIFEST = "model.xml", "model.bin", "manifest.json"
_OWNER = ".owner"  # in a temporary directory: locked by its writer while it writes
_TEMP = re.compile(r"\.[0-9a-f]{32}-")  # tempfile.mkdtemp(prefix=f".{key}-")
# A free lock proves the writer gone; the grace covers the instant between mkdtemp and the lock.
_ABANDONED_S = 60.0
# Without an owner file (written by an older version, or on a system without flock) only age
# tells: far longer than writing an entry takes (seconds, a minute for a large model).
_UNOWNED_S = 30 * 60.0
# Files whose content is the model (tokenizer files do not change the graph: the gateway tokenizes).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rerank-gateway" / "openvino"


def checkpoint_dir(path: str, revision: str | None) -> Path:
    """The checkpoint's local directory: ``path`` itself, or its snapshot in the Hugging Face cache.

    Only what the gateway reads is fetched (:func:`hub_patterns`), not the whole repository.
    """
    if os.path.isdir(path):
        return Path(path)
    from huggingface_hub import HfApi, snapshot_download

    try:
        files: list[str] | None = HfApi().list_repo_files(path, revision=revision)
    except Exception:  # noqa: BLE001 -- offline or unreachable: snapshot_download says what is wrong
        files = None
    allow, ignore = hub_patterns(files)
    return Path(snapshot_download(path, revision=revision, allow_patterns=allow, ignore_patterns=ignore))


# Config, tokenizer (tokenizer.json, vocab.txt, merges.txt, *.model) and sentence-transformers'
# files (modules.json, 1_Pooling/config.json, ...), and remote code; weights are picked apart.
_HUB_SMALL = ("*.json", "*.txt", "*.model", "*.py")


def hub_patterns(files: Iterable[str] | None) -> tuple[list[str], list[str] | None]:
    """``(allow_patterns, ignore_patterns)`` for a hub repo listing ``files``: the small files
    and the top-level weights in one format, safetensors when there are any, else ``.bin``
    (as transformers loads them), never onnx/, openvino/ or other frameworks' weights.
    Without a listing: the small files and top-level safetensors and .bin files."""
    if files is None:
        return [*_HUB_SMALL, "*.safetensors", "*.bin"], ["*/*.safetensors", "*/*.bin"]
    top = [f for f in files if "/" not in f]
    for suffixes in ((".safetensors",), (".bin",), (".pt", ".pth")):
        weights = [glob.escape(f) for f in top if f.endswith(suffixes)]
        if weights:
            break
    return [*_HUB_SMALL, *weights], None


def _sha256(file: Path) -> str:
    h = hashlib.sha256()
    with file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_digest(directory: Path) -> str:
    """SHA-256 over the names and contents of config.json and the weight files."""
    h = hashlib.sha256()
    files = sorted(
        p for p in directory.iterdir() if p.is_file() and (p.name == "config.json" or p.suffix in _WEIGHT_SUFFIXES)
    )
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in files):
        raise FileNotFoundError(f"no weight files in {directory}")
    for p in files:
        h.update(p.name.encode() + b"\0" + _sha256(p).encode() + b"\n")
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def cache_key(digest: str, options: dict[str, Any]) -> str:
    """Key of one exported model: checkpoint hash + export options + library versions."""
    versions = {d: _version(d) for d in ("openvino", "nncf", "torch", "transformers")}
    payload = {"export_version": EXPORT_VERSION, "checkpoint": digest, "options": options, "versions": versions}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


class ModelCache:
    """Exported models under ``root``, one directory per :func:`cache_key`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def load(self, key: str, core: Any) -> Any | None:
        """The cached ``openvino.Model`` of ``key``; None when absent or corrupted (then removed)."""
        entry = self.root / key
        if not entry.exists():
            return None
        problem = self._verify(entry, key)
        if problem is None:
            try:
                return core.read_model(str(entry / _XML), str(entry / _BIN))
            except Exception as exc:  # noqa: BLE001 -- any reader error means the entry is unusable
                problem = f"OpenVINO cannot read it ({type(exc).__name__})"
        log.warning("openvino_cache_corrupted", entry=str(entry), problem=problem, action="re-exporting")
        shutil.rmtree(entry, ignore_errors=True)
        return None

    @staticmethod
    def _verify(entry: Path, key: str) -> str | None:
        try:
            manifest = json.loads((entry / _MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "manifest missing or unreadable"
        if not isinstance(manifest, dict) or manifest.get("key") != key:
            return "manifest names another key"
        recorded = manifest.get("files")
        if not isinstance(recorded, dict):
            return "manifest records no file hashes"
        for name in (_XML, _BIN):
            try:
                digest = _sha256(entry / name)
            except OSError:
                return f"{name} missing"
            if digest != recorded.get(name):
                return f"{name} does not match its recorded hash"
        return None

    def store(self, key: str, model: Any, info: dict[str, Any]) -> None:
        """Save ``model`` (an ``openvino.Model``) as ``key``'s entry, atomically."""
        import openvino as ov

        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root))
        owner = _claim(tmp)
        try:
            # fp32 weights stay fp32 in the file: compression would change the exact mode's numbers.
            ov.save_model(model, str(tmp / _XML), compress_to_fp16=False)
            manifest = {"key": key, "files": {n: _sha256(tmp / n) for n in (_XML, _BIN)}, **info}
            (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")
            (tmp / _OWNER).unlink(missing_ok=True)  # not part of the entry
            try:
                os.replace(tmp, self.root / key)
            except OSError as exc:
                # ENOTEMPTY / EEXIST: another process stored the same entry first, which is fine.
                # Anything else (permissions, a full disk) leaves every start exporting again.
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    log.warning(
                        "openvino_cache_store_failed",
                        entry=str(self.root / key),
                        error=f"{type(exc).__name__}: {exc}",
                        action="serving the export uncached",
                    )
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            if owner is not None:
                os.close(owner)

    def sweep(self) -> None:
        """Remove the temporary directories no writer will finish (see the module's docstring)."""
        try:
            folders = [p for p in self.root.iterdir() if _TEMP.match(p.name) and p.is_dir()]
        except OSError:  # no cache directory yet
            return
        now = time.time()
        for folder in folders:
            try:
                idle = now - max(p.stat().st_mtime for p in [folder, *folder.iterdir()])
                alive = _owner_alive(folder)
            except OSError:  # renamed into place or removed meanwhile
                continue
            if (alive is False and idle > _ABANDONED_S) or (alive is None and idle > _UNOWNED_S):
                log.warning("openvino_cache_temp_removed", folder=str(folder), idle_s=round(idle))
                shutil.rmtree(folder, ignore_errors=True)

    def get_or_build(self, key: str, core: Any, build: Callable[[], Any], info: dict[str, Any]) -> tuple[Any, bool]:
        """(model, True when it came from the cache)."""
        self.sweep()
        model = self.load(key, core)
        if model is not None:
            return model, True
        model = build()
        self.store(key, model, info)
        # Read back what was stored so a first start runs the very graph later starts will.
        cached = self.load(key, core)
        return (cached if cached is not None else model), False


def _claim(folder: Path) -> int | None:
    """Lock ``folder``'s owner file for as long as the returned descriptor is open."""
    if fcntl is None:
        return None
    fd = os.open(folder / _OWNER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())  # for a person looking
    except OSError:  # a file system without locks: the folder is judged by age
        os.close(fd)
        (folder / _OWNER).unlink(missing_ok=True)
        return None
    return fd


def _owner_alive(folder: Path) -> bool | None:
    """Whether ``folder``'s writer still holds its lock; None when there is no lock to ask."""
    if fcntl is None:
        return None
    try:
        fd = os.open(folder / _OWNER, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # locks unsupported here
        return None
    finally:
        os.close(fd)  # also releases a lock taken here
    return False


def export_family(family: Any, *, example: Iterable[Iterable[int]] = ((1, 2, 3, 4), (1, 2, 3, 4))) -> Any:
    """Trace ``family.output`` over the checkpoint's fp32 weights into an ``openvino.Model``;
    a BERT-style cross-encoder's last layer computed for the first token only (``graph.py``).

    Inputs (i64, dynamic ``[batch, length]``): ``input_ids``, ``attention_mask`` and, for typed
    pairs, ``token_type_ids``; one f32 output ``[batch, k]``.
    """
    import openvino as ov
    import torch

    from adapters.families.cross_encoder import CrossEncoderFamily
    from adapters.runtimes.cpu.graph import trimmed_cross_encoder

    family.load_torch(torch.device("cpu"), torch.float32)
    trimmed = trimmed_cross_encoder(family._model) if isinstance(family, CrossEncoderFamily) else None
    if "sliding_attention" in (getattr(family._model.config, "layer_types", None) or ()):
        # A padded position farther than half the local window from every real token has no key
        # left to attend to: torch's SDPA returns zeros for such a fully masked row, OpenVINO's
        # converted SDPA NaN, which the next layer's attention spreads over the whole row (0 * NaN).
        # Eager attention adds a finite mask (softmax stays finite) and is what torch computes.
        family._model.set_attn_implementation("eager")
    names = ["input_ids", "attention_mask", *(["token_type_ids"] if family.typed else [])]

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # Registered, so its weights become the graph's constants.
            self.model = trimmed if trimmed is not None else family._model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            if trimmed is not None:
                return trimmed(*tensors)  # the same logits as family.output's (graph.py)
            return family.output(dict(zip(names, tensors, strict=True)))

    rows = [list(r) for r in example]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long)
    tensors = [ids, torch.ones_like(ids), *([torch.zeros_like(ids)] if family.typed else [])]
    try:
        with torch.inference_mode():
            model = ov.convert_model(
                Graph().eval(),
                example_input=tuple(tensors),
                input=[ov.PartialShape([-1, -1])] * len(names),
            )
    finally:
        family.unload()  # the torch weights are not needed once the graph holds them
    for port, name in zip(model.inputs, names, strict=True):
        port.get_tensor().set_names({name})
    model.outputs[0].get_tensor().set_names({"output"})
    return model
