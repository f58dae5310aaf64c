"""``rerank-gateway`` command line: ``serve``, ``check-config`` (and subcommands added by
other modules: ``keys``, ``bench``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence

from gateway.settings import ConfigError, load_settings
from schemas.config import Settings

__all__ = ("main",)


def _override_server(settings: Settings, host: str | None, port: int | None) -> Settings:
    import msgspec

    server = msgspec.structs.replace(
        settings.server,
        **{k: v for k, v in (("host", host), ("port", port)) if v is not None},
    )
    return msgspec.structs.replace(settings, server=server)


def _serve(args: argparse.Namespace) -> int:
    settings = _override_server(load_settings(args.config), args.host, args.port)
    from gateway.auth import check_exposure

    check_exposure(settings)  # no keys on a public address: refuse unless auth.open = true
    model_families(settings)  # an undetectable family or a family the engine cannot run: one line, exit 2
    from gateway.servers import run_granian, run_uvicorn

    workers = settings.server.workers
    with _multiprocess_metrics(workers):
        if workers > 1:
            _warn_per_worker_limits(settings)
        if settings.server.runner == "granian":
            run_granian(settings, args.config)
            return 0
        served = run_uvicorn(settings, args.config)
    if served and workers == 1:
        _exit_without_teardown(0)  # drained, engines stopped, log written: nothing left to do
    return 0 if served else 1


def _exit_without_teardown(code: int) -> None:
    """End the process as the interpreter would, minus its teardown of modules and objects.

    With torch and vLLM imported, Python's finalization (freeing ~700k objects and the native
    libraries' state) took 6-18 s on a loaded 2-core box, after the gateway had drained its
    requests and stopped its engines: most of a SIGTERM's time to exit. The steps of a normal
    exit that matter still run, in its order: join the non-daemon threads (thread-pool workers
    are told to stop first), atexit callbacks, flush the log; then the process ends.
    """
    import atexit
    import logging
    import threading

    join_threads = getattr(threading, "_shutdown", None)  # what Py_Finalize calls first
    if join_threads is not None:
        join_threads()
    elif any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return  # cannot join them as the interpreter would: exit the usual way
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def model_families(settings: Settings) -> dict[int, str]:
    """For each local model whose checkpoint is a directory here: the family it would get, and why.

    Raises ConfigError (one line, naming ``models[i].family``) for a family that cannot be
    detected or cannot run on the model's engine. Hub ids are left to the engine's start.
    """
    from adapters.base import EngineConfigError
    from adapters.families.detect import FamilyNotDetectedError, resolve_family, st_pipeline
    from schemas.config import FAMILY_RUNTIMES, LocalModelConfig

    found: dict[int, str] = {}
    for i, model in enumerate(settings.models):
        if not isinstance(model, LocalModelConfig) or not os.path.isdir(model.path):
            continue
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
            raise ConfigError(
                f"models[{i}].engine: '{model.path}' is a {detection.family} model ({detection.reason}), "
                f"which engine {kind!r} cannot run; use one of {runtimes}"
            )
        found[i] = f"{detection.family} ({detection.reason})"
    return found


@contextlib.contextmanager
def _multiprocess_metrics(workers: int) -> Iterator[None]:
    """Several workers: prometheus-client's multiprocess mode, so any worker's /metrics sums all.

    The counters of every worker live in files of one directory (PROMETHEUS_MULTIPROC_DIR, set
    before any worker imports prometheus_client). An operator's own directory is used as
    given (it must be empty at start); otherwise a fresh one is made and removed at exit.
    """
    if workers <= 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield
        return
    path = tempfile.mkdtemp(prefix="rerank-gateway-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    try:
        yield
    finally:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        shutil.rmtree(path, ignore_errors=True)


def _warn_per_worker_limits(settings: Settings) -> None:
    limited = [k.id for k in settings.auth.keys if k.rpm or k.tpm or k.max_concurrent]
    if limited and not settings.limits.redis_url:
        print(
            f"rerank-gateway: {settings.server.workers} workers without limits.redis_url: each worker "
            f"enforces the per-key limits of {', '.join(limited)} on its own (up to "
            f"{settings.server.workers}x the configured rate); set limits.redis_url to share them",
            file=sys.stderr,
        )


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    from adapters.families.checkpoint import CheckpointMismatchError, check_window, local_checkpoint_config
    from adapters.registry import missing_packages, registered_kinds
    from schemas.config import Qwen3LocalConfig, VllmGenerateEngineConfig

    families = model_families(settings)
    for i, model in enumerate(settings.models):
        kind = type(model).__struct_config__.tag
        if kind not in registered_kinds():
            raise ConfigError(f"model {model.name!r}: engine {kind!r} is not installed")
        missing = missing_packages(model)
        if missing is not None:
            raise ConfigError(f"model {model.name!r}: {missing}")
        if isinstance(model, Qwen3LocalConfig) and i in families and families[i].startswith("qwen3"):
            # A local Qwen3 checkpoint is checked now (encoder families cap their window at the
            # checkpoint's); a hub id is checked when the engine starts.
            hf = local_checkpoint_config(model.path) or {}
            positions = hf.get("max_position_embeddings")
            try:
                check_window(model.name, model.max_length, positions if isinstance(positions, int) else None,
                             extra_tokens=1 if isinstance(model, VllmGenerateEngineConfig) else 0)
            except CheckpointMismatchError as exc:
                raise ConfigError(str(exc)) from None
        line = f"model {model.name}: engine={kind}"
        if i in families:
            line += f" family={families[i]}"
        elif getattr(model, "family", None) is not None:
            line += f" family={model.family} (decided at start: '{model.path}' is not a local directory)"
        print(line + (f" aliases={list(model.aliases)}" if model.aliases else ""))
    print(f"config OK: {len(settings.models)} model(s); serving on {settings.server.host}:{settings.server.port}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rerank-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="TOML config file (default: $RERANK_CONFIG, else built-in defaults)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.set_defaults(func=_serve)
    check = sub.add_parser("check-config", help="validate the configuration and exit")
    check.add_argument("--config")
    check.set_defaults(func=_check_config)
    # bench's module imports only the standard library and msgspec; httpx/tqdm/matplotlib load when it runs.
    from gateway.bench.command import add_parser as add_bench_parser

    add_bench_parser(sub)
    from gateway.keys_cli import add_parser as add_keys_parser

    add_keys_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"rerank-gateway: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
