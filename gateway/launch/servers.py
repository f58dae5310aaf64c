"""Running the app under uvicorn or granian, with connection timeouts on both.

A client must not be able to hold a connection (a file descriptor) forever. Three bounds, all
under ``[server]``:

- ``keep_alive_timeout_s``: an idle connection (fresh, or between requests) is closed.
- ``header_read_timeout_s``: a request's headers must arrive within this time of their first
  byte (slow-loris); else the connection is closed without an answer.
- ``body_read_timeout_s``: the whole body must arrive within this time of the headers; else
  the gateway answers 408 and closes (enforced in the app, ``gateway.http.middleware``, so it is the
  same under both servers). A request answered without its body being read (404, 401, 413 by
  ``Content-Length``) is not read by the app, so under uvicorn the protocol closes the
  connection once this time has passed (each trickled byte would reset the keep-alive timer);
  granian (hyper) closes such a connection itself as soon as the answer is sent.

uvicorn has a keep-alive timeout but no header timeout and leaves a fresh connection that sends
nothing open forever; its protocol subclass (:mod:`gateway.launch.uvicorn_protocol`) adds both.
granian (hyper) has a header read timeout that also closes fresh idle connections, and its
keep-alive is on or off.

Every serving process also bounds what the C allocator keeps of large request bodies
(:func:`bound_malloc_retention`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
import sys
from typing import Any

from gateway.launch.uvicorn_protocol import timed_protocol
from gateway.serving import heap
from schemas.config import Settings

__all__ = (
    "SigtermDrain",
    "bound_malloc_retention",
    "create_granian_worker_app",
    "create_worker_app",
    "run_granian",
    "run_uvicorn",
)

# glibc's mallopt parameter and the threshold it had before it adapts (its documented default).
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024
# Engines that run torch in the serving process: their tensors are malloc'd too, and re-mapping
# (page-faulting) every large activation on each batch would cost inference time.
_IN_PROCESS_TORCH = frozenset({"transformers", "packed"})
# What granian's worker gets after shutdown_timeout_s before it is killed: the engines' stop
# (a vLLM engine: 2.2 s measured, docs/operating.md) and the worker's exit, with room to spare.
_GRANIAN_STOP_MARGIN_S = 10


def bound_malloc_retention(settings: Settings) -> bool:
    """Keep glibc's mmap threshold at 128 KiB in this process; True when it was set.

    glibc serves a block over the threshold with its own mmap and unmaps it on free, but raises
    the threshold to the size of each such block freed (up to 32 MiB): after one large body,
    every later body of that size comes from the heap, and what is freed there stays mapped
    between live small objects. Measured with the reliability suite's hostile requests (1 MB
    body limit, static engine): RSS +4.3 MB on the first pass and +8.7 MB on the second, then
    flat, with the Python heap flat (tracemalloc); with the threshold fixed, +2.5 and +0.7 MB
    (docs/reliability/). Setting it explicitly turns the adaptation off. Not done where torch
    runs in this process, where the user set ``MALLOC_MMAP_THRESHOLD_`` (glibc's own variable,
    read at start), or off glibc.
    """
    if sys.platform != "linux" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    engines = {str(type(m).__struct_config__.tag) for m in settings.models}
    if not settings.models or engines & _IN_PROCESS_TORCH:  # no [[models]]: the default is transformers
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt, nothing adapts
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def create_worker_app() -> Any:
    """The app factory of worker processes (``server.workers > 1``, granian): settings from the
    environment, as ``create_app()``, with this process's allocator bounded."""
    from gateway.app import create_app

    heap.enable()
    app = create_app()
    bound_malloc_retention(app.state.settings)
    return app


def create_granian_worker_app() -> Any:
    """The app factory of granian's worker processes: :func:`create_worker_app` plus the
    shutdown timer granian lacks (:class:`SigtermDrain`)."""
    app = create_worker_app()
    app.drain = SigtermDrain(app.state.settings.server.shutdown_timeout_s)
    app.on_startup.append(app.drain.install)  # after granian's own signal handlers are set
    return app


class SigtermDrain:
    """``server.shutdown_timeout_s`` for granian's workers: cancel the requests still running then.

    On SIGTERM/SIGINT a granian worker stops accepting and waits for every in-flight request
    without a bound; only then does it run the app's lifespan shutdown (which stops the engines:
    vLLM's processes, transformers' threads). Its supervisor kills the worker after
    ``workers_kill_timeout`` (:func:`run_granian`), so one stuck request meant no answer for its
    client, no request line and no engine stop. This handler, chained before granian's own,
    logs ``gateway_draining`` and starts a timer; when it fires, the requests still running
    are cancelled as uvicorn cancels them: :func:`gateway.http.middleware.request_context`
    answers 503 with ``Retry-After`` and logs them ``cancelled="shutdown"``. granian's drain then
    ends and the lifespan shutdown runs, well within the kill timeout.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cancelled: set[asyncio.Task[Any]] = set()
        self._draining = False

    def install(self) -> None:
        """Chain a handler before granian's SIGTERM/SIGINT handlers (run in the worker's main thread)."""
        import signal

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            if not callable(previous):  # nobody handles it as a shutdown: nothing to chain before
                continue

            def handler(signum: int, frame: Any, previous: Any = previous) -> None:
                if not self._draining:  # the supervisor forwards the signal: once is enough
                    self._draining = True
                    # A signal handler runs between two bytecodes of the loop's thread: hand over.
                    loop.call_soon_threadsafe(self._start, signal.Signals(signum).name)
                previous(signum, frame)  # granian's: stop accepting, drain, then the lifespan shutdown

            signal.signal(sig, handler)

    def _start(self, signal_name: str) -> None:
        import structlog

        structlog.get_logger("gateway.servers").info(
            "gateway_draining",
            signal=signal_name,
            in_flight_requests=len(self._tasks),
            shutdown_timeout_s=self.timeout_s,
        )
        asyncio.get_running_loop().call_later(self.timeout_s, self._cancel_in_flight)

    def _cancel_in_flight(self) -> None:
        for task in list(self._tasks):
            self._cancelled.add(task)
            task.cancel()

    async def run(self, request: Any) -> None:
        """Await one request's coroutine in its own task, cancellable by the timer."""
        task = asyncio.current_task()
        if task is None:  # driven outside a task (granian always makes one): nothing to cancel
            await request
            return
        self._tasks.add(task)
        try:
            await request
        except asyncio.CancelledError:
            # The timer's alone: the request has been answered 503 and logged; ending the task
            # normally spares the log granian's "Application callable raised an exception"
            # traceback. Any other cancellation propagates.
            if task not in self._cancelled or task.uncancel() > 0:
                raise
        finally:
            self._tasks.discard(task)
            self._cancelled.discard(task)


def run_uvicorn(settings: Settings, config_path: str | None = None) -> bool:
    """Serve until SIGTERM/SIGINT; True when the server started (and so shut down cleanly)."""
    import uvicorn

    server = settings.server
    common: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "timeout_keep_alive": server.keep_alive_timeout_s,  # used as a float
        "log_level": "warning",  # our own access line replaces uvicorn's
        "log_config": None,  # uvicorn's lines go through the root handler (JSON with format = "json")
        "access_log": False,
        # SIGTERM: stop accepting, let in-flight requests finish this long, then cancel them.
        "timeout_graceful_shutdown": server.shutdown_timeout_s,
    }
    if server.workers > 1:
        # uvicorn's supervisor binds the socket once; each spawned worker builds its own app
        # from the environment (RERANK_CONFIG and the host/port the command line decided).
        _export_for_workers(settings, config_path)
        uvicorn.run(
            "gateway.launch.servers:create_worker_app",
            factory=True,
            workers=server.workers,
            http=timed_protocol(None),
            **common,
        )
        return True
    from gateway.app import create_app

    bound_malloc_retention(settings)
    heap.enable()
    config = uvicorn.Config(
        create_app(settings, config_path=config_path),  # SIGHUP re-reads the keys from it
        http=timed_protocol(server.header_read_timeout_s, server.body_read_timeout_s),
        **common,
    )
    runner = _graceful_server(uvicorn.Server)(config)
    runner.run()
    return bool(runner.started)


def _export_for_workers(settings: Settings, config_path: str | None) -> None:
    """Worker processes read their settings again: hand them what this process decided."""
    if config_path:
        os.environ["RERANK_CONFIG"] = str(config_path)
    os.environ["RERANK_SERVER__HOST"] = settings.server.host
    os.environ["RERANK_SERVER__PORT"] = str(settings.server.port)


def _graceful_server(base: type) -> type:
    """uvicorn's Server, exiting 0 after a clean shutdown on SIGTERM/SIGINT.

    uvicorn re-raises the signal it handled once it has shut down, so the process would end
    "killed by SIGTERM" (exit -15) although it drained and stopped its engines: orchestrators
    and service managers read that as a crash.
    """
    import contextlib
    import signal

    import structlog

    log = structlog.get_logger("gateway.servers")

    class GracefulServer(base):  # type: ignore[misc]
        def handle_exit(self, sig: int, frame: object) -> None:
            if not self.should_exit:
                log.info(
                    "gateway_draining",
                    signal=signal.Signals(sig).name,
                    in_flight_connections=len(self.server_state.connections),
                    shutdown_timeout_s=self.config.timeout_graceful_shutdown,
                )
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
        "formatters": {"generic": {"()": "gateway.observability.logging.stdlib_formatter", "fmt": fmt}},
        "handlers": {
            "console": {"formatter": "generic", "class": "logging.StreamHandler", "stream": "ext://sys.stdout"}
        },
        "loggers": {"_granian": {"handlers": ["console"], "level": "WARNING", "propagate": False}},
    }


def run_granian(settings: Settings, config_path: str | None) -> None:
    from granian import Granian  # optional extra `granian`
    from granian.http import HTTP1Settings

    # granian imports the app factory in its worker, which reads the settings again.
    _export_for_workers(settings, config_path)
    server = settings.server
    # hyper's header-read timeout also runs while a connection waits for its next request, so
    # it bounds idle keep-alive connections too: use the smaller of the two bounds.
    header_ms = int(min(server.header_read_timeout_s, server.keep_alive_timeout_s) * 1000)
    Granian(
        "gateway.launch.servers:create_granian_worker_app",
        factory=True,
        address=server.host,
        port=server.port,
        interface="asgi",
        workers=settings.server.workers,
        http1_settings=HTTP1Settings(header_read_timeout=max(header_ms, 1)),
        log_access=False,  # our own access line replaces granian's
        log_level="warning",
        log_dictconfig=_granian_logging(settings),
        # On SIGTERM the worker drains, cancelling what still runs at shutdown_timeout_s
        # (SigtermDrain), then stops its engines (vLLM's processes get 2 s, then are killed).
        # The kill is the last resort, for a worker stuck past all that (a model still loading).
        workers_kill_timeout=math.ceil(settings.server.shutdown_timeout_s) + _GRANIAN_STOP_MARGIN_S,
    ).serve()
