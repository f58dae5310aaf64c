"""``rerank-gateway`` command line: ``serve``, ``check-config`` (and subcommands added by
other modules: ``keys``, ``bench``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

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
    if settings.server.runner == "granian":
        from granian import Granian  # optional extra `granian`

        if args.config:
            os.environ["RERANK_CONFIG"] = str(args.config)
        os.environ["RERANK_SERVER__HOST"] = settings.server.host
        os.environ["RERANK_SERVER__PORT"] = str(settings.server.port)
        Granian(
            "gateway.app:create_app",
            factory=True,
            address=settings.server.host,
            port=settings.server.port,
            interface="asgi",
            workers=1,
            log_access=False,  # our own access line replaces granian's
            log_level="warning",
            log_dictconfig=_granian_logging(settings),
            # The worker drains in-flight requests on SIGTERM; then it is killed.
            workers_kill_timeout=max(1, int(settings.server.shutdown_timeout_s) + 1),
        ).serve()
        return 0
    import uvicorn

    from gateway.app import create_app

    config = uvicorn.Config(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        log_level="warning",  # our own access line replaces uvicorn's
        log_config=None,  # uvicorn's lines go through the root handler (JSON with format = "json")
        access_log=False,
        # SIGTERM: stop accepting, let in-flight requests finish this long, then cancel them.
        timeout_graceful_shutdown=settings.server.shutdown_timeout_s,
    )
    server = _graceful_server(uvicorn.Server)(config)
    server.run()
    return 0 if server.started else 1


def _graceful_server(base: type) -> type:
    """uvicorn's Server, exiting 0 after a clean shutdown on SIGTERM/SIGINT.

    uvicorn re-raises the signal it handled once it has shut down, so the process would end
    "killed by SIGTERM" (exit -15) although it drained and stopped its engines: orchestrators
    and service managers read that as a crash.
    """
    import contextlib
    import signal

    import structlog

    log = structlog.get_logger("gateway.cli")

    class GracefulServer(base):  # type: ignore[misc, valid-type]
        def handle_exit(self, sig: int, frame: object) -> None:
            if not self.should_exit:
                log.info("gateway_draining", signal=signal.Signals(sig).name,
                         in_flight_connections=len(self.server_state.connections),
                         shutdown_timeout_s=self.config.timeout_graceful_shutdown)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):  # type: ignore[no-untyped-def]
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()  # shut down cleanly: nothing to re-raise

    return GracefulServer


def _granian_logging(settings: Settings) -> dict[str, object]:
    fmt = settings.logging.format
    return {
        "formatters": {"generic": {"()": "gateway.logging.stdlib_formatter", "fmt": fmt}},
        "handlers": {
            "console": {"formatter": "generic", "class": "logging.StreamHandler", "stream": "ext://sys.stdout"}
        },
        "loggers": {"_granian": {"handlers": ["console"], "level": "WARNING", "propagate": False}},
    }


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    from adapters.families.checkpoint import CheckpointMismatchError, check_window, local_checkpoint_config
    from adapters.registry import missing_packages, registered_kinds
    from schemas.config import Qwen3LocalConfig, VllmGenerateEngineConfig

    for model in settings.models:
        kind = type(model).__struct_config__.tag
        if kind not in registered_kinds():
            raise ConfigError(f"model {model.name!r}: engine {kind!r} is not installed")
        missing = missing_packages(model)
        if missing is not None:
            raise ConfigError(f"model {model.name!r}: {missing}")
        if isinstance(model, Qwen3LocalConfig):
            # A local checkpoint is checked now; a hub id is checked when the engine starts.
            hf = local_checkpoint_config(model.path) or {}
            positions = hf.get("max_position_embeddings")
            try:
                check_window(model.name, model.max_length, positions if isinstance(positions, int) else None,
                             extra_tokens=1 if isinstance(model, VllmGenerateEngineConfig) else 0)
            except CheckpointMismatchError as exc:
                raise ConfigError(str(exc)) from None
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
