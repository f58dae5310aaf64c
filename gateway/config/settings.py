"""Load :class:`schemas.config.Settings` from one TOML file plus ``RERANK_*`` overrides.

Precedence: built-in defaults < TOML file (``--config`` or ``RERANK_CONFIG``) < environment.
An environment variable names a path with double underscores, list items by index::

    RERANK_SERVER__PORT=9000
    RERANK_LOGGING__FORMAT=console
    RERANK_MODELS__0__PATH=/models/Qwen3-Reranker-0.6B

The TOML file is read strictly: a value of the wrong type (``port = "8001"``) is an error, as
on the request path. An environment value is text, so it is converted to the type of the field
it names (``"9000"`` -> 9000; a value starting with ``[`` or ``{`` is read as JSON, except for
string fields); an error in it names the variable. With no ``models`` at all, the default model
is served: ``Qwen/Qwen3-Reranker-0.6B`` as ``qwen3-reranker-0.6b`` on the best engine installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from gateway.config.config_schema import EnvValue, dotted, humanize, type_env_values
from gateway.config.config_schema import Path as FieldPath
from schemas.config import DEFAULT_MODEL_NAME, DEFAULT_MODEL_PATH, ModelReferenceError, Settings, check_references

__all__ = ("ConfigError", "cuda_present", "default_engine_kind", "load_settings")

ENV_PREFIX = "RERANK_"
CONFIG_ENV = "RERANK_CONFIG"
# One API key from the environment (containers): the key itself, or a file holding it (a
# mounted secret), turned into an ``auth.keys`` entry covering every model.
API_KEY_ENV = "RERANK_API_KEY"
API_KEY_FILE_ENV = "RERANK_API_KEY_FILE"
API_KEY_ID_ENV = "RERANK_API_KEY_ID"
# gateway.observability.logging hands vLLM's engine-core processes their log file through this variable.
VLLM_LOGGING_FILE_ENV = "RERANK_VLLM_LOGGING_FILE"
# Variables under the prefix that are not config overrides.
_NOT_OVERRIDES = frozenset({CONFIG_ENV, API_KEY_ENV, API_KEY_FILE_ENV, API_KEY_ID_ENV, VLLM_LOGGING_FILE_ENV})
_MIN_ENV_KEY_CHARS = 16
# The variables Kubernetes puts into every pod for each Service of its namespace (enableServiceLinks,
# on by default): a Service named "rerank-gateway" (deploy/k8s) or "rerank" gives RERANK_GATEWAY_PORT,
# RERANK_SERVICE_HOST, ... They name no config field (no "__"), so they are not overrides. A bare
# <SERVICE>_PORT is one only with its tcp://IP:PORT value (RERANK_SERVER_PORT=9000 stays a typo).
_SERVICE_LINK = re.compile(
    r"(?:[A-Z0-9_]*_)?(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?|PORT_\d+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)"
)
_SERVICE_PORT_LINK = re.compile(r"(?:[A-Z0-9_]*_)?PORT")
_LINK_ADDRESS = re.compile(r"(?:tcp|udp|sctp)://\S+")


class ConfigError(ValueError):
    """The configuration is invalid; the message is one line naming the field."""


def default_engine_kind(cuda: bool | None = None, path: str | None = None) -> str:
    """The best engine installed for the default model (checked without importing it).

    With a GPU: ``packed`` (torch + transformers), fastest on every figure measured on an H200
    (Qwen3: docs/benchmarks/gpu-h200-2026-12-01-c; cross-encoders: docs/engines-packed.md),
    unless ``path`` is a local checkpoint it cannot run (a DeBERTa cross-encoder,
    a bi-encoder); otherwise: ``vllm-score`` when vLLM is installed, else ``transformers``.
    ``cuda`` None: :func:`cuda_present`. A hub id is read from the local Hugging Face cache; one
    not downloaded yet keeps the GPU's default (config time never reaches the network).
    """
    cuda = cuda_present() if cuda is None else cuda
    # vLLM's engines register under these kinds when they are available (see adapters.registry).
    choices: tuple[tuple[str, str], ...] = (("packed", "transformers"),) if cuda and _packed_runs(path) else ()
    for kind, module in (*choices, ("vllm-score", "vllm"), ("transformers", "transformers")):
        if importlib.util.find_spec(module) is not None and _engine_registered(kind):
            return kind
    return "transformers"


def cuda_present(environ: Mapping[str, str] | None = None, dev: str = "/dev") -> bool:
    """Whether an NVIDIA GPU is visible, without importing torch or touching CUDA.

    ``torch.cuda.is_available()`` would initialise the CUDA driver in the gateway process,
    which vLLM's engine core must not inherit (it then has to be spawned; issue 24): the
    device nodes and ``CUDA_VISIBLE_DEVICES`` say the same without it.
    """
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    try:
        return any(n.startswith("nvidia") and n[6:].isdigit() for n in os.listdir(dev))
    except OSError:
        return False


def _packed_runs(path: str | None) -> bool:
    from adapters.families.checkpoint import cached_hub_config, is_hub_id, local_checkpoint_config
    from schemas.config import packed_runs_checkpoint

    hf_config = local_checkpoint_config(path) if path else None
    if hf_config is None and path and is_hub_id(path):
        hf_config = cached_hub_config(path)  # the local cache only: no network at config time
    return hf_config is None or packed_runs_checkpoint(hf_config)


def _engine_registered(kind: str) -> bool:
    from adapters.registry import registered_kinds

    return kind in registered_kinds()


def load_settings(
    config_path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    environ = os.environ if environ is None else environ
    path = config_path or environ.get(CONFIG_ENV) or None
    raw: dict[str, Any] = {}
    source = "built-in defaults"
    if path:
        source = str(path)
        try:
            raw = msgspec.toml.decode(Path(path).read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except OSError as exc:  # a directory, no permission, ...: one line, not a traceback
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or type(exc).__name__}") from None
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    defaulted = not raw.get("models")
    if defaulted:
        raw["models"] = [{"name": DEFAULT_MODEL_NAME, "path": DEFAULT_MODEL_PATH}]
    from_env: dict[FieldPath, str] = {}
    for key, value in sorted(environ.items()):
        if key.startswith(ENV_PREFIX) and key not in _NOT_OVERRIDES and not _is_service_link(key, value):
            from_env[_apply_override(raw, key, value)] = key
    if defaulted and isinstance(raw["models"][0], dict) and "engine" not in raw["models"][0]:
        # Chosen once overrides are in: RERANK_MODELS__0__PATH may name a checkpoint packed cannot run.
        model = raw["models"][0]
        model["engine"] = default_engine_kind(path=str(model.get("path") or DEFAULT_MODEL_PATH))
    try:
        type_env_values(raw)  # env text -> each field's type; unknown fields and engines, in words
    except ValueError as exc:  # the walk's own (with .path and .var)
        raise _config_error(exc, raw, from_env, source) from None
    # After the walk: RERANK_AUTH__KEYS='[...]' is a list by now, which the env key is appended to.
    _add_env_key(raw, environ)
    try:
        settings = msgspec.convert(raw, Settings, strict=True)
    except ValueError as exc:  # msgspec.ValidationError
        raise _config_error(exc, raw, from_env, source) from None
    _check_names(settings)
    return settings


def _config_error(exc: ValueError, raw: dict[str, Any], from_env: Mapping[FieldPath, str], source: str) -> ConfigError:
    where, message = _located(exc, raw)
    var = getattr(exc, "var", None) or _env_var_for(where, from_env)
    return ConfigError(f"invalid config ({var or source}): {message}")


def _is_service_link(key: str, value: str) -> bool:
    """A Kubernetes service-link variable (``RERANK_GATEWAY_PORT``...), not a config override."""
    rest = key[len(ENV_PREFIX) :]
    if "__" in rest:
        return False
    if _SERVICE_LINK.fullmatch(rest):
        return True
    return _SERVICE_PORT_LINK.fullmatch(rest) is not None and _LINK_ADDRESS.fullmatch(value) is not None


def _located(exc: ValueError, raw: dict[str, Any]) -> tuple[FieldPath, str]:
    """The field an error is about and a one-line sentence saying what is wrong with it."""
    if isinstance(exc, msgspec.ValidationError):
        return humanize(str(exc), raw)
    return getattr(exc, "path", ()), str(exc)


def _env_var_for(where: FieldPath, from_env: Mapping[FieldPath, str]) -> str | None:
    """The variable that set ``where`` or a table holding it (the longest such path wins)."""
    owners = [p for p in from_env if where[: len(p)] == p]
    return from_env[max(owners, key=len)] if owners else None


def _apply_override(raw: dict[str, Any], key: str, value: str) -> FieldPath:
    """Put ``value`` (still text: typed later by its field) where ``key`` points; return that path."""
    parts = key[len(ENV_PREFIX) :].lower().split("__")
    node: Any = raw
    path: list[str | int] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        leaf = EnvValue(value, key)
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"{key}: {dotted(tuple(path))} has {len(node)} item(s), no item {part!r} "
                    "(an override can change an item, not add one)"
                )
            index = int(part)
            path.append(index)
            if last:
                node[index] = leaf
            else:
                node = node[index]
        elif isinstance(node, dict):
            path.append(part)
            if last:
                node[part] = leaf
            else:
                node = node.setdefault(part, {})
        else:
            raise ConfigError(f"{key}: {dotted(tuple(path))} is not a table")
    return tuple(path)


def _add_env_key(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    """Append the key from RERANK_API_KEY / RERANK_API_KEY_FILE (only its hash is kept)."""
    key = environ.get(API_KEY_ENV)
    path = environ.get(API_KEY_FILE_ENV)
    if key and path:
        raise ConfigError(f"set {API_KEY_ENV} or {API_KEY_FILE_ENV}, not both")
    if path:
        try:
            key = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{API_KEY_FILE_ENV}: cannot read {path} ({type(exc).__name__})") from None
        if not key:
            # An empty mounted secret (or one caught mid-rewrite by a SIGHUP reload) is a mistake,
            # not "no key": the gateway would run open, or a reload would drop this key.
            raise ConfigError(f"{API_KEY_FILE_ENV}: {path} is empty")
    if not key:
        return
    source = API_KEY_FILE_ENV if path else API_KEY_ENV
    if len(key) < _MIN_ENV_KEY_CHARS or any(c.isspace() for c in key):
        raise ConfigError(
            f"{source}: the key must be at least {_MIN_ENV_KEY_CHARS} characters without spaces "
            "(`rerank-gateway keys create` makes one)"
        )
    entry = {
        "id": environ.get(API_KEY_ID_ENV, "env"),
        "hash": "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest(),
        "models": ["*"],
    }
    auth = raw.setdefault("auth", {})
    if not isinstance(auth, dict):
        raise ConfigError("invalid config: auth is not a table")
    auth["keys"] = [*auth.get("keys", ()), entry]


def _check_names(settings: Settings) -> None:
    seen: dict[str, str] = {}
    for model in settings.models:
        for name in (model.name, *model.aliases):
            if name in seen:
                raise ConfigError(
                    f"invalid config: model name {name!r} is used twice (by {seen[name]!r} and {model.name!r})"
                )
            seen[name] = model.name
    try:  # chains (and any model made of others) name configured models: checked once, in schemas
        check_references(settings.models)
    except ModelReferenceError as exc:
        raise ConfigError(f"invalid config: {exc}") from None
    tei_model = settings.dialects.tei_model
    if tei_model is not None and tei_model not in seen:
        raise ConfigError(
            f"invalid config: dialects.tei_model {tei_model!r} is not a configured model name or alias "
            f"(configured: {', '.join(sorted(seen))})"
        )
