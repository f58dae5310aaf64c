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
import enum
import time
from collections.abc import Iterable
from typing import Any

import structlog

from adapters.base import EngineDeadError, RerankEngine
from adapters.registry import build_engine
from gateway.errors import ModelUnavailableError, UnknownModelError
from schemas.config import EngineConfig, Settings

__all__ = ("ModelRegistry", "ModelRuntime", "ModelState")

log = structlog.get_logger("gateway.models")

# Backoff between attempts to restart a dead engine: 1 s, 2 s, 4 s, ... capped.
_RESTART_BACKOFF_MAX_S = 60.0


class ModelState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNHEALTHY = "unhealthy"


class ModelRuntime:
    """One configured model: config, engine, state, and its admission counter."""

    def __init__(self, config: EngineConfig, index: int) -> None:
        self.config = config
        self.index = index
        self.engine: RerankEngine | None = None
        self.state = ModelState.LOADING
        self.error: str | None = None
        self.loaded_at: float | None = None
        self.in_flight = 0
        # Set while a dead engine is being restarted (see engine_died).
        self.restart_task: asyncio.Task[None] | None = None
        self.restarts = 0

    @property
    def restarting(self) -> bool:
        return self.restart_task is not None and not self.restart_task.done()

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def kind(self) -> str:
        return str(type(self.config).__struct_config__.tag)

    def usable_engine(self) -> RerankEngine:
        """The engine, or 503 saying why the model cannot serve now."""
        if self.state is ModelState.READY and self.engine is not None:
            return self.engine
        if self.state is ModelState.LOADING:
            raise ModelUnavailableError(f"model '{self.name}' is still loading; retry shortly", retry_after=10)
        if self.restarting:
            raise ModelUnavailableError(f"model '{self.name}' is restarting its engine: {self.error}", retry_after=10)
        raise ModelUnavailableError(f"model '{self.name}' is unavailable: {self.error}", retry_after=30)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "engine": self.kind, "state": self.state.value}
        out.update(self.describe())
        if self.error:
            out["error"] = self.error
        if self.config.aliases:
            out["aliases"] = list(self.config.aliases)
        out["in_flight"] = self.in_flight
        if self.restarts:
            out["restarts"] = self.restarts
        # Engines may report their own counters (e.g. vLLM's requests per engine step).
        stats = getattr(self.engine, "stats", None)
        if callable(stats):
            out["engine_stats"] = stats()
        return out

    def describe(self) -> dict[str, str]:
        """Family, runtime, device and dtype: the engine's once loaded, else the configured family."""
        describe = getattr(self.engine, "describe", None)
        if callable(describe):
            return dict(describe())
        family = getattr(self.config, "family", None)
        return {"family": family} if family is not None else {}

    @property
    def family(self) -> str | None:
        """The family serving this model (the configured one, "auto" until the engine resolved it)."""
        return self.describe().get("family")

    def engine_died(self, engine: RerankEngine, exc: BaseException) -> None:
        """``engine`` reported itself dead: answer 503 and restart it in the background.

        Ignored unless ``engine`` is the current one: requests that were in flight on an
        engine already replaced must not restart its healthy successor.
        """
        if engine is not self.engine or self.restarting:
            return
        self.state, self.error = ModelState.UNHEALTHY, f"engine died ({type(exc).__name__}: {exc})"[:500]
        log.error("engine_died", model=self.name, error=self.error)
        self.restart_task = asyncio.create_task(self._restart(), name=f"restart:{self.name}")

    async def _restart(self) -> None:
        delay = 1.0
        while True:
            old, self.engine = self.engine, None
            if old is not None:
                await _quietly(old.stop())
            started = time.perf_counter()
            try:
                await self._start_engine()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep trying: the cause (memory, a GPU fault) may pass
                self.error = f"engine restart failed ({type(exc).__name__}: {exc}); retrying in {delay:.0f}s"[:500]
                log.error("engine_restart_failed", model=self.name, error=self.error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RESTART_BACKOFF_MAX_S)
                continue
            self.restarts += 1
            self.state, self.error, self.loaded_at = ModelState.READY, None, time.time()
            log.info("engine_restarted", model=self.name, load_s=round(time.perf_counter() - started, 2))
            return

    async def _start_engine(self) -> None:
        """Build and start a fresh engine as ``self.engine``; one that fails to start is stopped."""
        engine = build_engine(self.config)
        try:
            await engine.start()
        except BaseException:
            await _quietly(engine.stop())
            raise
        self.engine = engine

    async def load(self) -> None:
        started = time.perf_counter()
        try:
            await self._start_engine()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure to load is reported, never fatal to the gateway
            self.state, self.error = ModelState.FAILED, self._load_hint(exc)
            log.error("model_load_failed", model=self.name, error=self.error)
            return
        self.state, self.error, self.loaded_at = ModelState.READY, None, time.time()
        log.info("model_ready", model=self.name, engine=self.kind, load_s=round(time.perf_counter() - started, 2))

    def _load_hint(self, exc: Exception) -> str:
        from adapters.families.detect import FamilyNotDetectedError

        if isinstance(exc, FamilyNotDetectedError):  # one line naming the field to set
            return exc.for_field(f"models[{self.index}].family")
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
        path = getattr(self.config, "path", None)
        # Only a failure to find or fetch the checkpoint gets the local-directory hint; a config
        # error (window too small, bad engine argument) is shown as it is.
        missing = isinstance(exc, OSError) or "huggingface" in text.lower()
        if path is None or not missing:
            return f"could not start: {text}"
        return (
            f"could not load weights from '{path}' ({text}). If this machine cannot reach the "
            f"Hugging Face hub, download the checkpoint elsewhere and set models[{self.index}].path "
            f"(env RERANK_MODELS__{self.index}__PATH) to its local directory"
        )


class ModelRegistry:
    """Name (or alias) -> :class:`ModelRuntime`; owns loading and shutdown."""

    def __init__(self, settings: Settings) -> None:
        self._runtimes = [ModelRuntime(cfg, i) for i, cfg in enumerate(settings.models)]
        self._by_name: dict[str, ModelRuntime] = {}
        for rt in self._runtimes:
            for name in (rt.name, *rt.config.aliases):
                self._by_name[name] = rt
        self._tasks: list[asyncio.Task[None]] = []

    def __iter__(self) -> Iterable[ModelRuntime]:
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
        self._tasks = [asyncio.create_task(rt.load(), name=f"load:{rt.name}") for rt in self._runtimes]

    async def wait_loaded(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        tasks = [*self._tasks, *(rt.restart_task for rt in self._runtimes if rt.restart_task is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for rt in self._runtimes:
            if rt.engine is not None:
                await _quietly(rt.engine.stop())
                rt.engine = None

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
            except Exception as exc:  # any failed probe means "not ready", with the reason
                rt.state, rt.error = ModelState.UNHEALTHY, f"{type(exc).__name__}: {exc}"[:500]
            else:
                rt.state, rt.error = ModelState.READY, None

    @property
    def ready(self) -> bool:
        return all(rt.state is ModelState.READY for rt in self._runtimes)

    def statuses(self) -> list[dict[str, Any]]:
        return [rt.status() for rt in self._runtimes]


async def _quietly(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception as exc:  # shutdown must go on for the other models
        log.warning("engine_stop_failed", error=f"{type(exc).__name__}: {exc}")
