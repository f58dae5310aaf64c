"""What ``serve`` checks before it loads any weights; ``check-config`` runs the same function.

Two kinds of findings. A *refusal* is a config ``serve`` will not start with (exit 2): a public
address without keys, keys or a cache that cannot be built, a family the engine cannot run, a
window larger than the checkpoint's. A *model finding* is a model that cannot load as things
stand (a local path that does not exist, an engine whose packages are missing, an upstream key
that is not set): ``serve`` starts without it, answers its requests 503 with the fix and keeps
retrying (a directory mounted later, a key added to a secret store); ``check-config`` fails on
both, so "config OK" means every model can at least start loading. Nothing here imports torch,
transformers or vLLM, and no weights are read: local ``config.json`` files only.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

from gateway.config.settings import ConfigError
from schemas.config import (
    DashScopeEngineConfig,
    GatedPrecisionConfig,
    GgufEngineConfig,
    HostedRerankConfig,
    LocalModelConfig,
    PoolEngineConfig,
    Settings,
    VllmGenerateEngineConfig,
)

__all__ = ("Finding", "Preflight", "preflight")


@dataclass(frozen=True, slots=True)
class Finding:
    message: str  # one line naming the field (models[0].path, server.host) and the fix
    refuses: bool  # serve exits 2; else serve starts and this model fails to load (503, retried)


@dataclass(slots=True)
class Preflight:
    families: dict[int, str] = field(default_factory=dict)  # models[i] -> "qwen3 (why)" for local dirs
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # serves as configured; worth knowing

    def refuse(self) -> None:
        """Raise the first refusal, the way ``serve`` stops (ConfigError: one line, exit 2)."""
        for finding in self.findings:
            if finding.refuses:
                raise ConfigError(finding.message)


def preflight(settings: Settings) -> Preflight:
    report = Preflight()
    _server(settings, report)
    for i, model in enumerate(settings.models):
        _model(i, model, report)
    return report


def _server(settings: Settings, report: Preflight) -> None:
    from gateway.security.auth import KeyStore, check_exposure, scope_warnings
    from gateway.serving.cache import build_cache

    # The app's own constructors: what would raise while it is built raises here first.
    for check in (
        lambda: check_exposure(settings),
        lambda: KeyStore(settings.auth.keys),
        lambda: build_cache(settings),
    ):
        try:
            check()
        except ConfigError as exc:
            report.findings.append(Finding(str(exc), refuses=True))
    if settings.server.runner == "granian" and importlib.util.find_spec("granian") is None:
        report.findings.append(
            Finding(
                "server.runner = \"granian\" needs the granian package: pip install 'rerank-gateway[granian]', "
                'or set server.runner = "uvicorn"',
                refuses=True,
            )
        )
    report.warnings += scope_warnings(settings)
    workers = settings.server.workers
    limited = [k.id for k in settings.auth.keys if k.rpm or k.tpm or k.max_concurrent]
    if workers > 1 and limited and not settings.limits.redis_url:
        report.warnings.append(
            f"{workers} workers without limits.redis_url: each worker enforces the per-key limits of "
            f"{', '.join(limited)} on its own (up to {workers}x the configured rate); set limits.redis_url "
            "to share them"
        )


def _model(i: int, model: object, report: Preflight) -> None:
    if isinstance(model, PoolEngineConfig) and model.read_timeout_s >= model.timeout_s:
        # The request's deadline cancels the call first, and a cancel never counts against a
        # replica (its budget may have gone to another replica), so a hung one would stay in.
        report.warnings.append(
            f"models[{i}] ({model.name}): read_timeout_s ({model.read_timeout_s}) is not below timeout_s "
            f"({model.timeout_s}), so a replica that stops answering is never ejected for it; set "
            "read_timeout_s below timeout_s"
        )
    from adapters.families.checkpoint import missing_local_path
    from adapters.registry import missing_packages

    missing = missing_packages(model)  # type: ignore[arg-type]
    if missing is not None:
        report.findings.append(Finding(f"models[{i}] ({model.name}): {missing}", refuses=False))  # type: ignore[attr-defined]
    path = getattr(model, "path", None)
    env = f"env RERANK_MODELS__{i}__PATH"
    if isinstance(model, GgufEngineConfig) and not os.path.isfile(model.path):
        report.findings.append(
            Finding(
                f"models[{i}].path ({env}): no file '{model.path}' on this machine; engine 'gguf' needs a local "
                ".gguf file",
                refuses=False,
            )
        )
    elif isinstance(path, str) and missing_local_path(path):
        report.findings.append(
            Finding(
                f"models[{i}].path ({env}): '{path}' does not exist on this machine (and it is not a Hugging "
                "Face hub id)",
                refuses=False,
            )
        )
    elif isinstance(model, LocalModelConfig) and os.path.exists(model.path) and not os.path.isdir(model.path):
        report.findings.append(
            Finding(
                f"models[{i}].path ({env}): '{model.path}' is a file; engine '{type(model).__struct_config__.tag}' "
                "needs the checkpoint's directory (the one holding config.json; a .gguf file goes to engine 'gguf')",
                refuses=True,
            )
        )
    elif isinstance(model, LocalModelConfig) and os.path.isdir(model.path):
        try:
            report.families[i] = _local_family(i, model)
        except ConfigError as exc:
            report.findings.append(Finding(str(exc), refuses=True))
    if isinstance(model, GatedPrecisionConfig) and model.parity_set is not None:  # set only with a reduced precision
        from adapters.runtimes.parity import read_golden_set

        try:
            read_golden_set(model.parity_set)
        except ValueError as exc:  # the line the engine would refuse the model with at load
            report.findings.append(
                Finding(f"models[{i}].parity_set (env RERANK_MODELS__{i}__PARITY_SET): {exc}", refuses=False)
            )
    if isinstance(model, GatedPrecisionConfig) and model.qrels_set is not None:  # set only with a reduced precision
        from adapters.runtimes.judgements import load_beir

        try:
            load_beir(model.qrels_set, model.qrels_split)  # as adapters/runtimes/qrels_gate.py will
        except ValueError as exc:  # the line the engine would refuse the model with at load
            report.findings.append(
                Finding(f"models[{i}].qrels_set (env RERANK_MODELS__{i}__QRELS_SET): {exc}", refuses=False)
            )
    if isinstance(model, DashScopeEngineConfig):
        from adapters.upstreams.http import resolve_api_key

        if resolve_api_key(model.api_key, model.api_key_env) is None:
            where = f"the environment variable {model.api_key_env}" if model.api_key_env else "api_key_env"
            report.findings.append(
                Finding(f"models[{i}] ({model.name}): no DashScope API key: set api_key or {where}", refuses=False)
            )
    if isinstance(model, HostedRerankConfig):
        from adapters.base import EngineConfigError
        from adapters.upstreams.http import read_api_key

        try:
            found = read_api_key(model.api_key, model.api_key_file, model.api_key_env) is not None
        except EngineConfigError as exc:  # the key file cannot be read: the line the model fails to load with
            report.findings.append(Finding(f"models[{i}] ({model.name}): {exc}", refuses=False))
            found = True
        if not found:
            where = f"the environment variable {model.api_key_env}" if model.api_key_env else "api_key_env"
            report.findings.append(
                Finding(
                    f"models[{i}] ({model.name}): no API key found: set api_key, api_key_file or {where}", refuses=False
                )
            )


def _local_family(i: int, model: LocalModelConfig) -> str:
    """The family a local checkpoint directory gets and why; ConfigError when it cannot serve."""
    from adapters.base import EngineConfigError
    from adapters.families.checkpoint import CheckpointMismatchError, check_window, local_checkpoint_config
    from adapters.families.detect import FamilyNotDetectedError, resolve_family, st_pipeline
    from schemas.config import FAMILY_RUNTIMES, RUNTIME_REFUSALS

    kind = str(type(model).__struct_config__.tag)
    try:
        detection, files = resolve_family(model.family, model.path, model.revision)
        if detection.family == "bi-encoder":  # a pipeline served differently is refused (st_files)
            st_pipeline(files, model.pooling)
    except FamilyNotDetectedError as exc:
        raise ConfigError(exc.for_field(f"models[{i}].family")) from None
    except EngineConfigError as exc:
        raise ConfigError(f"models[{i}] ('{model.path}'): {exc}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"models[{i}].path: cannot read '{model.path}' ({exc})") from None
    if kind not in FAMILY_RUNTIMES.get(detection.family, frozenset()):
        runtimes = ", ".join(sorted(FAMILY_RUNTIMES.get(detection.family, ())))
        why = RUNTIME_REFUSALS.get((detection.family, kind))
        raise ConfigError(
            f"models[{i}].engine: '{model.path}' is a {detection.family} model ({detection.reason}), "
            f"which engine {kind!r} cannot run{f' ({why})' if why else ''}; use one of {runtimes}"
        )
    if kind == "packed" and detection.family == "cross-encoder":
        from schemas.config import packed_encoder_refusal

        why = packed_encoder_refusal(files.config, getattr(model, "precision", "auto"))
        if why is not None:
            raise ConfigError(f"models[{i}].engine: '{model.path}': {why}")
    if detection.family == "qwen3":
        # Encoder families cap their window at the checkpoint's; a Qwen3 window over the
        # checkpoint's positions is refused (a hub checkpoint: when the engine starts).
        positions = (local_checkpoint_config(model.path) or {}).get("max_position_embeddings")
        try:
            check_window(
                model.name,
                model.max_length,
                positions if isinstance(positions, int) else None,
                extra_tokens=1 if isinstance(model, VllmGenerateEngineConfig) else 0,
            )
        except CheckpointMismatchError as exc:
            raise ConfigError(f"models[{i}].max_length: {exc}") from None
    return f"{detection.family} ({detection.reason})"
