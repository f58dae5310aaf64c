"""What a configured model's state answers: admission of its requests and its line in ``/ready``.

``ModelRuntimeState`` holds a model's engine, state and counters and reads them (``usable_engine``:
the engine or a 503 saying why not; ``status``: the ``/ready`` entry); its subclass
``models.ModelRuntime`` changes them (load, restart, engine died). Apart so that the transitions
read on their own in ``models``, which also keeps building the engine (tests replace
``build_engine`` there).
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from typing import TYPE_CHECKING, Any

from adapters.base import EngineObserver, RerankEngine
from adapters.families.checkpoint import is_hub_id
from gateway.errors import ModelUnavailableError
from gateway.serving.fingerprint import model_fingerprint
from schemas.config import EngineConfig, ServerConfig, VllmEngineConfig

if TYPE_CHECKING:
    from gateway.serving.routing.cascade import Cascade
    from gateway.serving.routing.chain import Chain

__all__ = ("ModelRuntimeState", "ModelState")


class ModelState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNHEALTHY = "unhealthy"


class ModelRuntimeState:
    """One configured model's config, engine, state and admission counter, and what they answer."""

    def __init__(self, config: EngineConfig, index: int, server: ServerConfig | None = None) -> None:
        self.config = config
        self.index = index
        self._server = server if server is not None else ServerConfig()
        self.engine: RerankEngine | None = None
        self.state = ModelState.LOADING
        # The full cause, for /ready and the log; never in a response body.
        self.error: str | None = None
        # What a client may read in the 503 (gateway-written: how to fix, never exception text).
        self.hint: str | None = None
        self.load_attempts = 0
        self.next_load_at: float | None = None  # monotonic time of the next load attempt
        self.loading_since: float | None = None  # monotonic start of the attempt that runs now
        # Since when the model has been unable to serve (failed or unhealthy); liveness reads it.
        self.down_since: float | None = None
        self.loaded_at: float | None = None
        self.in_flight = 0
        # Set while a dead engine is being restarted (see engine_died).
        self.restart_task: asyncio.Task[None] | None = None
        self.restarts = 0
        # Engine steps and prefix-cache lookups go to the metrics (gateway.serving.telemetry) through this.
        self.observer: EngineObserver | None = None
        # Set once the first load attempt has ended, loaded or failed (ModelRegistry.start's order).
        self.first_attempt_done = asyncio.Event()
        self._fingerprint: str | None = None
        # Set for an ``engine = "chain"`` model (by ModelRegistry): its targets and their health.
        # Such a model has no engine of its own; the service routes its requests.
        self.chain: Chain | None = None
        # Set for an ``engine = "cascade"`` model (by ModelRegistry): its stages.
        self.cascade: Cascade | None = None

    @property
    def fingerprint(self) -> str:
        """Hash of the config and checkpoint files behind the scores (the response cache keys on it).

        Taken when an engine has started, from the files it has just read; before that (a hit
        may be served while the model loads) from the files it is about to read.
        """
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.config)
        return self._fingerprint

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
        if (
            self.state is ModelState.UNHEALTHY
            and self.engine is not None
            and not self.restarting
            and getattr(self.engine, "heals_with_traffic", False)
        ):
            # A pool readmits its replicas by probing them when traffic arrives (and answers 503
            # itself while none passes): refusing its requests here would keep it down until
            # the next GET /ready.
            return self.engine
        if self.state is ModelState.LOADING:
            if self.hint:  # a retry: the last attempt's fix still applies until this one succeeds
                raise ModelUnavailableError(
                    f"model '{self.name}' is loading again (attempt {self.load_attempts}; the last one failed: "
                    f"{self.hint}). The cause is in GET /ready and the log",
                    retry_after=10,
                )
            raise ModelUnavailableError(f"model '{self.name}' is still loading; retry shortly", retry_after=10)
        if self.restarting:
            raise ModelUnavailableError(f"model '{self.name}' is restarting its engine; retry shortly", retry_after=10)
        if self.state is ModelState.FAILED:
            wait = self.next_retry_s()
            when = f"next attempt in {wait} s" if wait else "loading again now"
            raise ModelUnavailableError(
                f"model '{self.name}' failed to load ({when}): {self.hint}. The cause is in GET /ready and the log",
                retry_after=max(1, wait or 5),
            )
        raise ModelUnavailableError(
            f"model '{self.name}' is unhealthy; the cause is in GET /ready and the log", retry_after=10
        )

    def next_retry_s(self) -> int | None:
        """Whole seconds until the next load attempt (rounded up), or None while one runs."""
        if self.next_load_at is None:
            return None
        return max(0, math.ceil(self.next_load_at - time.monotonic()))

    def loading_activity(self) -> str:
        """What the running load attempt does, in words, for /ready: "loading" alone said nothing
        about whether the gateway was waiting on the network, the disk or the engine."""
        path = getattr(self.config, "path", None)
        if isinstance(path, str) and is_hub_id(path):
            what = f"fetching '{path}' from the Hugging Face hub (or its local cache), then starting the engine"
        elif isinstance(path, str):
            what = f"reading '{path}' and starting the engine"
        else:
            what = "starting the engine"
        since = "" if self.loading_since is None else f", {int(time.monotonic() - self.loading_since)} s so far"
        return f"{what} (attempt {self.load_attempts}{since})"

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "engine": self.kind, "state": self.state.value}
        out.update(self.describe())
        if self.error:
            out["error"] = self.error
        if self.hint:
            out["fix"] = self.hint
        if self.state is ModelState.FAILED:
            out["load_attempts"] = self.load_attempts
            out["next_retry_s"] = self.next_retry_s()  # failed: waiting for the next attempt
        elif self.state is ModelState.LOADING and self.load_attempts > 1:
            out["load_attempts"] = self.load_attempts  # a retry runs; error and fix are the last attempt's
        if self.state is ModelState.LOADING and self.load_attempts:
            out["doing"] = self.loading_activity()
        if self.config.aliases:
            out["aliases"] = list(self.config.aliases)
        out["in_flight"] = self.in_flight
        if self.chain is not None:
            out.update(self.chain.status())
        if self.cascade is not None:
            out.update(self.cascade.status())
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

    @property
    def runs_vllm(self) -> bool:
        """vLLM engine-core processes serve this model (they must start before CUDA is used here)."""
        return isinstance(self.config, VllmEngineConfig)
