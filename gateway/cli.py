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
from typing import Any

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
    workers = settings.server.workers
    if workers > 1 or settings.server.runner == "granian":
        # Worker processes build their own app from the environment: pass what the command
        # line decided on.
        if args.config:
            os.environ["RERANK_CONFIG"] = str(args.config)
        os.environ["RERANK_SERVER__HOST"] = settings.server.host
        os.environ["RERANK_SERVER__PORT"] = str(settings.server.port)
    with _multiprocess_metrics(workers):
        if workers > 1:
            _warn_per_worker_limits(settings)
        if settings.server.runner == "granian":
            from granian import Granian  # optional extra `granian`

            Granian(
                "gateway.app:create_app",
                factory=True,
                address=settings.server.host,
                port=settings.server.port,
                interface="asgi",
                workers=workers,
            ).serve()
            return 0
        import uvicorn

        common: dict[str, Any] = {
            "host": settings.server.host,
            "port": settings.server.port,
            "log_level": "warning",  # our own access line replaces uvicorn's
            "access_log": False,
            "timeout_graceful_shutdown": 30,
        }
        if workers > 1:
            # uvicorn's supervisor binds the socket once; each worker process accepts on it.
            uvicorn.run("gateway.app:create_app", factory=True, workers=workers, **common)
        else:
            from gateway.app import create_app

            uvicorn.run(create_app(settings), **common)
    return 0


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
    from adapters.registry import registered_kinds

    for model in settings.models:
        kind = type(model).__struct_config__.tag
        if kind not in registered_kinds():
            raise ConfigError(f"model {model.name!r}: engine {kind!r} is not installed")
        print(f"model {model.name}: engine={kind}" + (f" aliases={list(model.aliases)}" if model.aliases else ""))
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
