"""``rerank-gateway`` command line: ``serve``, ``check-config`` (and subcommands added by
other modules: ``keys``, ``bench``, ``eval``). What ``--help`` prints is written here for people; this
docstring is for readers of the code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence

from gateway.config.settings import ConfigError, load_settings
from schemas.config import GgufEngineConfig, LocalModelConfig, Settings

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
    from gateway.launch.preflight import preflight

    # check-config runs this same function: a refusal here is a refusal there. Model findings
    # (a missing local path, an engine's packages) do not stop serve: that model answers 503
    # with the fix and is retried, as /ready shows.
    report = preflight(settings)
    report.refuse()
    from adapters.families.layout import prepare_rust_tokenizers
    from gateway.launch.servers import run_granian, run_uvicorn

    # The Rust tokenizer's settings are read at its first batch, whoever's (vLLM's own tokenizer
    # included): set before any engine loads, and inherited by worker processes.
    prepare_rust_tokenizers()

    workers = settings.server.workers
    with _multiprocess_metrics(workers):
        for warning in report.warnings:
            print(f"rerank-gateway: {warning}", file=sys.stderr)
        if settings.server.runner == "granian":
            run_granian(settings, args.config)
            return 0
        served = run_uvicorn(settings, args.config)
    if served and workers == 1:
        _exit_without_teardown(0)  # drained, engines stopped, log written: nothing left to do
    return 0 if served else 1


# How long the exit waits for threads still working after the drain: a model still loading
# (weights, a vLLM engine's start) cannot be interrupted, and joining it held SIGTERM's exit for
# the whole load (36 s for a vLLM-CPU start; an orchestrator kills the pod at 30 s).
EXIT_JOIN_GRACE_S = 3.0


def _exit_without_teardown(code: int, *, grace_s: float = EXIT_JOIN_GRACE_S) -> None:
    """End the process as the interpreter would, minus its teardown of modules and objects.

    With torch and vLLM imported, Python's finalization (freeing ~700k objects and the native
    libraries' state) took 6-18 s on a loaded 2-core box, after the gateway had drained its
    requests and stopped its engines: most of a SIGTERM's time to exit. The steps of a normal
    exit that matter still run, in its order: join the non-daemon threads (thread-pool workers
    are told to stop first), atexit callbacks, flush the log; then the process ends.

    Threads still running after ``grace_s`` (a model load the shutdown could not stop) are left
    behind: the child processes they started (vLLM's engine core) are killed, the log flushed,
    and the process ends without the atexit callbacks, which could wait on the same load.
    """
    import atexit
    import logging
    import threading
    import time

    join_threads = getattr(threading, "_shutdown", None)  # what Py_Finalize calls first
    others = [t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()]
    # threading._shutdown joins without a bound and only from the main thread: wait here first,
    # bounded, for the threads still running.
    deadline = time.monotonic() + grace_s
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = sorted(t.name for t in others if t.is_alive())
    if left:
        import structlog

        structlog.get_logger("gateway.servers").warning(
            "exit_abandoning_threads", threads=left, grace_s=grace_s, why="still working after the drain (a model load)"
        )
        _kill_children()
        _end(code)
    if join_threads is not None:
        join_threads()  # the threading atexit callbacks; nothing is left to wait for
    atexit._run_exitfuncs()
    logging.shutdown()
    _end(code)


def _kill_children(wait_s: float = 2.0) -> None:
    """Terminate every process this one started and their descendants (vLLM's engine core and
    its executor's worker: the worker outlived a killed core, spinning, when only the core was
    signalled), then kill those still alive after ``wait_s``. psutil (a dependency of vLLM)
    sees the whole tree; without it, the processes started through multiprocessing."""
    try:
        import psutil
    except ImportError:
        import multiprocessing

        children = multiprocessing.active_children()
        for child in children:
            with contextlib.suppress(Exception):
                child.terminate()
        for child in children:
            child.join(wait_s)
            if child.is_alive():
                with contextlib.suppress(Exception):
                    child.kill()
        return
    procs = psutil.Process().children(recursive=True)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=wait_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=wait_s)


def _end(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


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


def _check_config(args: argparse.Namespace) -> int:
    settings = _override_server(load_settings(args.config), args.host, args.port)
    from gateway.launch.preflight import preflight

    report = preflight(settings)
    for i, model in enumerate(settings.models):
        kind = type(model).__struct_config__.tag
        line = f"model {model.name}: engine={kind}"
        if i in report.families:
            line += f" family={report.families[i]}"
        elif isinstance(model, (LocalModelConfig, GgufEngineConfig)):  # the engines that have a family
            from adapters.families.checkpoint import is_hub_id

            if is_hub_id(model.path):
                line += f" family={model.family} (decided at start: '{model.path}' is not a local directory)"
            else:
                line += f" family={model.family} (undecided: no '{model.path}' on this machine)"
        print(line + (f" aliases={list(model.aliases)}" if model.aliases else ""))
    for warning in report.warnings:
        print(f"rerank-gateway: warning: {warning}", file=sys.stderr)
    for finding in report.findings:
        then = "serve refuses to start" if finding.refuses else "serve starts without this model"
        print(f"rerank-gateway: {finding.message} [{then}]", file=sys.stderr)
    if report.findings:
        return 2
    print(f"config OK: {len(settings.models)} model(s); serving on {settings.server.host}:{settings.server.port}")
    return 0


_DESCRIPTION = """\
A Cohere-compatible rerank API in front of rerank models: run in this process (transformers,
vLLM, llama.cpp) or served elsewhere (DashScope, vLLM/TEI/Infinity replicas).

Start with `rerank-gateway check-config`, then `rerank-gateway serve`; each command has --help.
"""

_CONFIG_HELP = """\
configuration:
  The config is built-in defaults, then the TOML file (--config, else $RERANK_CONFIG), then
  environment variables RERANK_<SECTION>__<FIELD> (double underscores; list items by index):
    RERANK_SERVER__PORT=9000  RERANK_LOGGING__LEVEL=DEBUG  RERANK_MODELS__0__PATH=/models/qwen
  RERANK_API_KEY (or RERANK_API_KEY_FILE, a file holding it; RERANK_API_KEY_ID names it) adds an
  API key allowed every model. The file is strict about types (port = 8000, not "8000");
  environment values are converted to the field's type. Without [[models]], the gateway
  serves Qwen/Qwen3-Reranker-0.6B as qwen3-reranker-0.6b.
"""


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="TOML config file (default: $RERANK_CONFIG, else built-in defaults)"
    )
    parser.add_argument(
        "--host",
        help="bind address, overrides server.host (default 127.0.0.1; any other "
        "address needs API keys or auth.open = true)",
    )
    parser.add_argument("--port", type=int, help="port, overrides server.port (default 8000)")


def build_parser() -> argparse.ArgumentParser:
    from gateway import __version__

    parser = argparse.ArgumentParser(
        prog="rerank-gateway", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the gateway",
        epilog=_CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the gateway. The checks of check-config run first: a config they refuse stops\n"
        "here with one line (exit 2). Models load in the background: GET /ready says how.",
    )
    _add_config_options(serve)
    serve.set_defaults(func=_serve)
    check = sub.add_parser(
        "check-config",
        help="check the configuration as serve would, without loading weights",
        epilog=_CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check the configuration with the checks serve runs before it loads weights (API\n"
        "keys on a public address, local paths, engines' packages, families, windows) and print\n"
        "each model's engine and family. Exit 0 when serve would start loading every model, 2\n"
        "when not, with each problem on its own line.",
    )
    _add_config_options(check)
    check.set_defaults(func=_check_config)
    # bench's module imports only the standard library and msgspec; httpx/tqdm/matplotlib load when it runs.
    from gateway.bench.command import add_parser as add_bench_parser

    add_bench_parser(sub)
    # eval's module imports only the standard library; ranx/bm25s/httpx load when it runs.
    from gateway.eval.command import add_parser as add_eval_parser

    add_eval_parser(sub)
    from gateway.security.keys_cli import add_parser as add_keys_parser

    add_keys_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The subcommand's own arguments, for the reports that record their command line (eval).
    args.argv = list(argv if argv is not None else sys.argv[1:])[1:]
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"rerank-gateway: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
