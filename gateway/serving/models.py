"""The configured models at run time: their engines, load state and admission control.

Engines load in background tasks started by the app lifespan, so the gateway answers
``/health`` at once and ``/ready`` tells, per model, whether it is loading, ready or failed and
why. A model that cannot load does not stop the gateway: its requests get 503 with a message
saying how to point the model at a local directory. An engine that dies while serving
(:class:`adapters.base.EngineDeadError`) turns its model unhealthy (503 + Retry-After) and is
restarted in the background with capped exponential backoff, without a gateway restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import anyio.to_thread
import structlog

from adapters.base import EngineDeadError, RerankEngine
from adapters.registry import build_engine, imports_heavy_libraries
from gateway.config.settings import ConfigError
from gateway.errors import UnknownModelError
from gateway.observability.logging import adopt_library_loggers
from gateway.serving import heap
from gateway.serving.fingerprint import model_fingerprint
from gateway.serving.load_failures import fix_for
from gateway.serving.model_state import ModelRuntimeState, ModelState
from gateway.serving.routing.cascade import Cascade
from gateway.serving.routing.chain import Chain
from schemas.config import (
    CascadeEngineConfig,
    ChainEngineConfig,
    ComposedModelConfig,
    EngineConfig,
    ModelReferenceError,
    Settings,
    check_references,
)

__all__ = ("ModelRegistry", "ModelRuntime", "ModelState", "describe_exception")

log = structlog.get_logger("gateway.models")

# Backoff between attempts to restart a dead engine: 1 s, 2 s, 4 s, ... capped.
_RESTART_BACKOFF_MAX_S = 60.0
# Longest error text kept for /ready and the log (a vLLM validation error with its causes fits).
_ERROR_CHARS = 4000


def describe_exception(exc: BaseException) -> str:
    """The whole error on one line: every message of the cause chain, whitespace collapsed.

    Libraries put the useful part on later lines or in the cause (vLLM's ``ValidationError``
    says "1 validation error for ModelConfig" first and why only after), so nothing is cut
    but the total length.
    """
    parts: list[str] = []
    seen: set[int] = set()
    texts: set[str] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = " ".join(str(current).split())
        # Libraries re-raise the same message wrapped, or quote their cause's text in their own
        # ("cannot read x (HFValidationError: <text>)"): the root cause is said once.
        if text not in texts and not (text and parts and text in parts[-1]):
            texts.add(text)
            parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    out = " <- caused by ".join(parts)
    return out if len(out) <= _ERROR_CHARS else out[: _ERROR_CHARS - 1] + "…"


class ModelRuntime(ModelRuntimeState):
    """One configured model: its state (``model_state``) and how it changes: load, restart, engine died."""

    def engine_died(self, engine: RerankEngine, exc: BaseException) -> None:
        """``engine`` reported itself dead: answer 503 and restart it in the background.

        Ignored unless ``engine`` is the current one: requests that were in flight on an
        engine already replaced must not restart its healthy successor.
        """
        if engine is not self.engine or self.restarting:
            return
        self.state, self.error = ModelState.UNHEALTHY, f"engine died ({describe_exception(exc)})"
        self.down_since = self.down_since or time.monotonic()
        log.error("engine_died", model=self.name, error=self.error)
        self.restart_task = asyncio.create_task(self._restart(), name=f"restart:{self.name}")

    async def _restart(self) -> None:
        delay = 1.0
        while True:
            old, self.engine = self.engine, None
            if old is not None:
                heap.thaw()  # frozen, the old engine's cycles (and its weights) would never be freed
                await _quietly(old.stop())
                old = None  # not held (and frozen again) while its successor loads
            started = time.perf_counter()
            try:
                await self._start_engine()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001  # keep trying: the cause (memory, a GPU fault) may pass
                self.error = f"engine restart failed ({describe_exception(exc)}); retrying in {delay:.0f}s"
                log.error("engine_restart_failed", model=self.name, error=self.error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RESTART_BACKOFF_MAX_S)
                continue
            self.restarts += 1
            self.state, self.error, self.loaded_at, self.down_since = ModelState.READY, None, time.time(), None
            log.info("engine_restarted", model=self.name, load_s=round(time.perf_counter() - started, 2))
            return

    async def _start_engine(self) -> None:
        """Build and start a fresh engine as ``self.engine``; one that fails to start is stopped."""
        # Building imports the engine's libraries (torch alone takes seconds): off the event
        # loop, so /health, /ready and the other models answer meanwhile.
        if imports_heavy_libraries(self.config):
            engine = await anyio.to_thread.run_sync(_build_engine, self.config)
        else:  # nothing heavy to import: built at once, so a static model is ready in the same tick
            engine = build_engine(self.config)
        adopt_library_loggers()  # the engine's libraries may have installed log handlers of their own
        if self.observer is not None and hasattr(engine, "observer"):
            engine.observer = self.observer
        try:
            await engine.start()
        except BaseException:
            heap.thaw()  # another model's settle may have frozen this engine's half-built objects
            await _quietly(engine.stop())
            raise
        self.engine = engine
        self._fingerprint = model_fingerprint(self.config)
        heap.settle(f"model {self.name} loaded")

    async def load(self, after: list[asyncio.Event] | None = None) -> None:
        """Load the engine; on failure retry with capped exponential backoff until it loads.

        ``after``: events to wait for before the first attempt (see :meth:`ModelRegistry.start`).

        A model stays ``failed`` (503 with the fix and a Retry-After equal to the time to the
        next attempt) between attempts: a download that failed for want of network, a GPU
        another process held, or a directory mounted late can all succeed later.
        """
        for event in after or ():
            await event.wait()
        delay = self._server.load_retry_initial_s
        while True:
            self.load_attempts += 1
            # /ready says "loading" while an attempt runs; error and fix stay the last attempt's.
            self.state, self.next_load_at, self.loading_since = ModelState.LOADING, None, time.monotonic()
            log.info(
                "model_loading",
                model=self.name,
                engine=self.kind,
                attempt=self.load_attempts,
                path=getattr(self.config, "path", None),
            )
            started = time.perf_counter()
            try:
                await self._start_engine()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001  # any failure to load is reported, never fatal to the gateway
                self.state, self.error, self.hint = ModelState.FAILED, describe_exception(exc), self._hint(exc)
                self.down_since = self.down_since or time.monotonic()
                self.next_load_at = time.monotonic() + delay
                log.error(
                    "model_load_failed",
                    model=self.name,
                    error=self.error,
                    fix=self.hint,
                    attempt=self.load_attempts,
                    next_retry_s=delay,
                )
                self.first_attempt_done.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._server.load_retry_max_s)
                continue
            self.state, self.error, self.hint, self.loaded_at = ModelState.READY, None, None, time.time()
            self.down_since = self.next_load_at = None
            self.first_attempt_done.set()
            log.info(
                "model_ready",
                model=self.name,
                engine=self.kind,
                load_s=round(time.perf_counter() - started, 2),
                attempt=self.load_attempts,
            )
            return

    def _hint(self, exc: Exception) -> str:
        """How to fix a failed load, in the gateway's words (safe for a response body)."""
        return fix_for(self.config, self.index, exc)


class ModelRegistry:
    """Name (or alias) -> :class:`ModelRuntime`; owns loading and shutdown."""

    def __init__(self, settings: Settings) -> None:
        self._server = settings.server
        self._runtimes = [ModelRuntime(cfg, i, settings.server) for i, cfg in enumerate(settings.models)]
        self._by_name: dict[str, ModelRuntime] = {}
        for rt in self._runtimes:
            for name in (rt.name, *rt.config.aliases):
                self._by_name[name] = rt
        try:  # load_settings checked them already; Settings built in code are checked here
            references = check_references(settings.models)
        except ModelReferenceError as exc:
            raise ConfigError(f"invalid config: {exc}") from None
        for rt in self._runtimes:
            if isinstance(rt.config, ComposedModelConfig):
                # No engine of its own: it serves through the models it names, which load as usual.
                rt.state = ModelState.READY
                rt.first_attempt_done.set()
            if isinstance(rt.config, ChainEngineConfig):
                rt.chain = Chain(rt.config, [self._by_name[name] for name in references[rt.name]])
            if isinstance(rt.config, CascadeEngineConfig):
                rt.cascade = Cascade(rt.config, [self._by_name[name] for name in references[rt.name]])
        self._tasks: list[asyncio.Task[None]] = []

    def __iter__(self) -> Iterator[ModelRuntime]:
        return iter(self._runtimes)

    @property
    def default(self) -> ModelRuntime:
        return self._runtimes[0]

    def get(self, name: str | None) -> ModelRuntime:
        if name is None:
            return self.default
        runtime = self._by_name.get(name)
        if runtime is None:
            raise UnknownModelError(
                f"model '{name}' not found, make sure the correct model ID was used; "
                f"available: {', '.join(sorted(self._by_name))}"
            )
        return runtime

    def start(self) -> None:
        """Load every model in the background: vLLM models first, the others once those have started.

        vLLM forks its engine-core process from this one; if another engine (packed,
        transformers on CUDA) has initialised CUDA here first, vLLM must spawn it instead and,
        measured on an H200 (issue 24), served 18-21 % slower beside a packed model. So the
        other models wait until each vLLM model's first load attempt has ended (loaded or
        failed); a later vLLM restart spawns its process (adapters.runtimes.vllm_base).
        """
        first = [rt.first_attempt_done for rt in self._runtimes if rt.runs_vllm]
        self._tasks = [
            asyncio.create_task(rt.load(None if rt.runs_vllm else first), name=f"load:{rt.name}")
            for rt in self._runtimes
            if not isinstance(rt.config, ComposedModelConfig)
        ]

    async def wait_loaded(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        tasks = [*self._tasks, *(rt.restart_task for rt in self._runtimes if rt.restart_task is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # All at once: each vLLM engine waits seconds for its engine-core processes to exit.
        engines = [rt.engine for rt in self._runtimes if rt.engine is not None]
        for rt in self._runtimes:
            rt.engine = None
        await asyncio.gather(*(_quietly(engine.stop()) for engine in engines))

    async def refresh_health(self) -> None:
        """Ask every loaded engine whether it can serve; flip READY <-> UNHEALTHY."""
        for rt in self._runtimes:
            engine = rt.engine
            if engine is None or rt.restarting or rt.state not in (ModelState.READY, ModelState.UNHEALTHY):
                continue
            try:
                await asyncio.wait_for(engine.check_health(), timeout=5)
            except EngineDeadError as exc:  # died while idle: restart it now, not at the next request
                rt.engine_died(engine, exc)
            except Exception as exc:  # noqa: BLE001  # any failed probe means "not ready", with the reason
                if rt.engine is engine and not rt.restarting:  # not a replaced engine's verdict
                    rt.state, rt.error = ModelState.UNHEALTHY, describe_exception(exc)
                    rt.down_since = rt.down_since or time.monotonic()
            else:
                if rt.engine is engine and not rt.restarting:
                    rt.state, rt.error, rt.down_since = ModelState.READY, None, None
        for rt in self._runtimes:
            if rt.chain is not None:  # after its targets: ready while one of them can serve
                serving = rt.chain.serving()
                rt.state = ModelState.READY if serving else ModelState.UNHEALTHY
                rt.error = None if serving else "no target of the chain can serve"
                rt.down_since = None if serving else (rt.down_since or time.monotonic())

    def liveness_failure(self) -> str | None:
        """Why the process should be restarted, or None while it is alive.

        Every model failed or unhealthy for longer than ``server.liveness_failure_after_s``:
        retrying in place has not helped, so /health turns 503 and the orchestrator restarts
        the pod (a fresh process, perhaps on another node, may succeed).
        """
        bound = self._server.liveness_failure_after_s
        if not bound or not self._runtimes:
            return None
        # Models made of others have no engine to restart: their targets decide.
        since = [rt.down_since for rt in self._runtimes if not isinstance(rt.config, ComposedModelConfig)]
        if not since:
            return None
        if any(s is None for s in since):
            return None
        down_s = time.monotonic() - max(s for s in since if s is not None)
        if down_s < bound:
            return None
        return (
            f"every model has been unable to serve for more than {bound:g} s "
            "(server.liveness_failure_after_s); see GET /ready for the causes"
        )

    @property
    def ready(self) -> bool:
        """Every model can serve; a chain's target that cannot is covered while the chain serves
        through another one (a replica taken out of its load balancer for a local engine that is
        loading would defeat the chain in front of it; the target's own name answers 503 meanwhile)."""
        covered = {
            t.runtime.name
            for rt in self._runtimes
            if rt.chain is not None and rt.state is ModelState.READY
            for t in rt.chain.targets
        }
        return all(rt.state is ModelState.READY or rt.name in covered for rt in self._runtimes)

    def statuses(self) -> list[dict[str, Any]]:
        return [rt.status() for rt in self._runtimes]


def _build_engine(config: EngineConfig) -> RerankEngine:
    # build_engine imports one engine module at a time and resolves the heavy libraries' lazy
    # names (transformers' AutoTokenizer...) before any engine starts loading in its own thread.
    return build_engine(config)


async def _quietly(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception as exc:  # noqa: BLE001  # shutdown must go on for the other models
        log.warning("engine_stop_failed", error=f"{type(exc).__name__}: {exc}")
