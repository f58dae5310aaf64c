"""One ``engine = "chain"`` model: its targets, their health, and the order a request tries them in.

A request goes to the first target that can take it, each target at most once, all within the
chain's ``timeout_s`` (one deadline). An attempt runs within its target's own ``timeout_s`` and
within ``attempt_timeout_s`` -- by default half of what is left of the deadline while another
target remains to try, so a hanging target leaves the next one time to answer; the last attempt
gets all that is left. What a failed attempt means:

=====================================  ===========  ===============  ========================
the target ...                         outcome      next target?     counts towards ejection?
=====================================  ===========  ===============  ========================
is loading, failed, unhealthy          not_ready    yes              no (its state says so)
refuses admission (its queue is full)  overloaded   yes              no (busy is not broken)
is skipped by spill-over (saturated)   spilled      yes; tried last  no
cannot do what the request asks (422)  unsupported  yes              no
did not answer in time                 timeout      yes              yes
failed: transport, 5xx, 429, died ...  failed       yes              yes
refused the request itself (4xx)       refused      no: answered     no
is ejected (cooling down)              skipped      yes              --
=====================================  ===========  ===============  ========================

"unsupported" is a valid request one engine cannot serve and another can (raw scores from an
engine that outputs only [0, 1]; cutting long texts at the start on an upstream that cuts them
at the end): when no target could, the client gets the first target's 422, not a 503.

Ejection is the pool's own bookkeeping (:class:`adapters.outliers.Outliers`): a target failing
``eject_after_failures`` requests in a row is skipped for its cooldown; then its probe (the
model's state, and its engine's health check) readmits it, and the first answer ends its run.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import structlog

from adapters.base import (
    EngineError,
    EngineInputError,
    EngineOverloadedError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from adapters.outliers import Member, OutlierPolicy, Outliers
from gateway.errors import GatewayError, ModelUnavailableError, UnsupportedByEngineError
from gateway.observability import tracing
from gateway.serving.model_state import ModelRuntimeState, ModelState
from gateway.serving.routing.saturation import saturated
from schemas.config import ChainEngineConfig

__all__ = ("Attempted", "Chain", "Target", "failover_outcome")

log = structlog.get_logger("gateway.routing")

T = TypeVar("T")
# (chain, target, outcome) -> None: the per-target metrics (gateway.serving.telemetry sets it).
Observe = Callable[[str, str, str], None]
# An attempt whose target's own timeout_s ends within this of what is left of the chain's deadline
# runs under the target's timer alone (a second timer per request cost ~2 % of a passthrough's CPU).
_OWN_TIMER_SLACK_S = 0.05
# A target's health probe, bounded: a pool's check_health probes its replicas over HTTP.
_PROBE_TIMEOUT_S = 5.0


def mixes_models(runtime: ModelRuntimeState) -> bool:
    """Whether ``runtime``'s answers may be another model's scores: it is (or routes through) a
    chain of other models. Such answers are never cached under a name (the preferred model's
    answers would be mixed with a fallback's for as long as the cache keeps them)."""
    chain = runtime.chain
    if chain is None:
        return False
    return chain.config.accepts == "other-models" or any(mixes_models(t.runtime) for t in chain.targets)


class Target(Member):
    """One configured model in a chain, and its passive health (:class:`adapters.outliers.Member`)."""

    __slots__ = ("runtime",)

    def __init__(self, runtime: ModelRuntimeState) -> None:
        super().__init__(runtime.name)
        self.runtime = runtime

    @property
    def name(self) -> str:
        return self.runtime.name


class Attempted(Generic[T]):
    """What a chain's request produced: the answer, the target that served it and each attempt's outcome."""

    __slots__ = ("attempts", "target", "value")

    def __init__(self, value: T, target: str, attempts: list[tuple[str, str]]) -> None:
        self.value = value
        self.target = target
        self.attempts = attempts  # (target, outcome), in the order they happened


def failover_outcome(exc: BaseException) -> tuple[str, bool] | None:
    """``(outcome, counts towards ejection)`` for an attempt that raised ``exc``; None: answer with it.

    Never moves on for what the request caused (a 4xx: bad input, too long): another target
    would refuse it too, and the client must see why. A valid request this target's engine
    cannot serve (:class:`UnsupportedByEngineError`) moves on: another engine may.
    """
    if isinstance(exc, ModelUnavailableError):
        return "not_ready", False
    if isinstance(exc, EngineOverloadedError):
        return "overloaded", False
    if isinstance(exc, UnsupportedByEngineError):
        return "unsupported", False
    if isinstance(exc, EngineInputError | GatewayError):
        return None
    if isinstance(exc, EngineTimeoutError):
        return "timeout", True
    if isinstance(exc, EngineError):  # transport, upstream 5xx / 429, a dead engine, a misconfigured upstream
        return "failed", True
    return None  # anything else is a bug: a 500 with its traceback, not hidden behind another target


class Chain:
    """The routing state of one chain model; :meth:`route` runs one request through it."""

    def __init__(
        self,
        config: ChainEngineConfig,
        targets: list[ModelRuntimeState],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.name = config.name
        self.targets = [Target(rt) for rt in targets]
        self.outliers: Outliers[Target] = Outliers(
            self.targets,
            OutlierPolicy(
                eject_after_failures=config.eject_after_failures,
                cooldown_s=config.cooldown_s,
                max_cooldown_s=config.effective_max_cooldown_s,
                max_ejected_share=config.max_ejected_share,
            ),
            model=config.name,
            kind="target",
            logger=log,
            clock=clock,
        )
        self.observe: Observe | None = None
        self._spill = config.mode == "spillover"

    # -- what the service asks ---------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """The response cache's model fingerprint: the chain's own fields and every target's fingerprint.

        A target's new weights or settings change it, as they change the target's own key.
        """
        parts = [self.config.accepts, *(t.runtime.fingerprint for t in self.targets)]
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()

    def cacheable(self, target: str) -> bool:
        """Whether an answer ``target`` computed may be stored under the chain's name.

        A chain of replicas: any target's (same model, same scores). A chain of other models:
        only the first target's, so the fallback's scores are never served from the cache
        once the preferred model is back (and a hit is always the preferred model's answer).
        """
        if self.config.accepts == "replicas":
            # Unless a target is itself a chain that may answer with another model's scores.
            return not any(mixes_models(t.runtime) for t in self.targets)
        return target == self.targets[0].name and not mixes_models(self.targets[0].runtime)

    def status(self) -> dict[str, Any]:
        """The chain's ``/ready`` entry: each target's state and health."""
        now = self.outliers.clock()
        return {
            "mode": self.config.mode,
            "accepts": self.config.accepts,
            "targets": [
                {
                    "name": t.name,
                    "state": t.runtime.state.value,
                    "admitted": t.admitted,
                    "consecutive_failures": t.consecutive_failures,
                    "cooldown_left_s": None if t.ejected_until is None else round(max(0.0, t.ejected_until - now), 1),
                }
                for t in self.targets
            ],
        }

    def serving(self) -> bool:
        """Some target can serve now (the chain's own state in ``/ready``)."""
        return any(t.runtime.state is ModelState.READY for t in self.targets)

    # -- one request -------------------------------------------------------------------------
    async def route(self, compute: Callable[[ModelRuntimeState], Awaitable[T]]) -> Attempted[T]:
        """Run ``compute`` (one whole attempt on one target) on the targets in turn until one answers.

        Raises the refusal of a request the target refused itself (4xx), :class:`EngineTimeoutError`
        when the chain's deadline is over, else :class:`EngineUnavailableError` (503) naming what
        each target did.
        """
        deadline = time.monotonic() + self.config.timeout_s
        attempts: list[tuple[str, str]] = []
        admitted = self.targets
        if not all(t.ejected_until is None for t in admitted):  # someone cools down: skip it, or probe it
            admitted = await self.outliers.admitted_of(self.targets, self._probe)
            for target in self.targets:
                if target not in admitted:
                    self._record(attempts, target, "skipped")
        passed: list[Target] = []  # saturated: tried only if every other target fails
        unsupported: list[Exception] = []  # what each target that cannot serve the request said
        for i, target in enumerate(admitted):
            if self._spill and i < len(admitted) - 1:
                why = saturated(
                    target.runtime, max_depth=self.config.spill_queue_depth, max_wait_s=self.config.spill_wait_s
                )
                if why is not None:
                    self._record(attempts, target, "spilled")
                    passed.append(target)
                    continue
            last = i == len(admitted) - 1 and not passed
            done = await self._attempt(target, compute, deadline, attempts, last, unsupported)
            if done is not None:
                return Attempted(done[0], target.name, attempts)
        for j, target in enumerate(passed):
            done = await self._attempt(target, compute, deadline, attempts, j == len(passed) - 1, unsupported)
            if done is not None:
                return Attempted(done[0], target.name, attempts)
        if unsupported and all(outcome == "unsupported" for _, outcome in attempts):
            raise unsupported[0]  # no target can do it: the client learns why (422), not "unavailable"
        if time.monotonic() >= deadline:
            raise EngineTimeoutError(
                f"chain '{self.name}' did not answer within {self.config.timeout_s:g}s (timeout_s)"
            )
        tried = ", ".join(f"{name}: {outcome}" for name, outcome in attempts)
        raise EngineUnavailableError(
            f"no target of model '{self.name}' could take the request ({tried})",
            retry_after=self.outliers.retry_after(),
        )

    async def _attempt(
        self,
        target: Target,
        compute: Callable[[ModelRuntimeState], Awaitable[T]],
        deadline: float,
        attempts: list[tuple[str, str]],
        last: bool,
        unsupported: list[Exception],
    ) -> tuple[T] | None:
        """One attempt on one target, as one ``route.attempt`` span (gateway.observability.tracing)."""
        with tracing.span("route.attempt", **{"rerank.chain": self.name, "rerank.target": target.name}):
            done = await self._attempt_once(target, compute, deadline, attempts, last, unsupported)
            tracing.annotate(**{"rerank.outcome": attempts[-1][1]})
            return done

    async def _attempt_once(
        self,
        target: Target,
        compute: Callable[[ModelRuntimeState], Awaitable[T]],
        deadline: float,
        attempts: list[tuple[str, str]],
        last: bool,
        unsupported: list[Exception],
    ) -> tuple[T] | None:
        """One attempt on one target: the single place where an attempt starts and ends.
        ``(answer,)``, or None to move on; raises what must be answered as it is. ``last``: no
        other target remains, so the attempt may take all that is left of the deadline."""
        left = deadline - time.monotonic()
        if left <= 0:
            self._record(attempts, target, "timeout")
            return None
        if not last:
            share = self.config.attempt_timeout_s
            left = min(left, left / 2 if share is None else share)
        try:
            if left < target.runtime.config.timeout_s - _OWN_TIMER_SLACK_S:
                async with asyncio.timeout(left):
                    value = await compute(target.runtime)
            else:  # the target's own timeout_s ends its engine call about as soon: one timer per request, not two
                value = await compute(target.runtime)
        except TimeoutError:  # the chain's timer, not the target's own timeout_s (that is EngineTimeoutError)
            self._record(attempts, target, "timeout")
            # A failure like its own timeout: a target that hangs past its share of the chain's
            # deadline again and again is ejected, so later requests go straight to the next target.
            self.outliers.failed(target, "timeout: the chain's deadline")
            return None
        except Exception as exc:
            verdict = failover_outcome(exc)
            if verdict is None:
                self._record(attempts, target, "refused")
                raise
            outcome, counts = verdict
            self._record(attempts, target, outcome)
            if outcome == "unsupported":
                unsupported.append(exc)
            if counts:
                self.outliers.failed(target, f"{outcome}: {type(exc).__name__}")
            return None
        self.outliers.answered(target)
        self._record(attempts, target, "served")
        return (value,)

    def _record(self, attempts: list[tuple[str, str]], target: Target, outcome: str) -> None:
        attempts.append((target.name, outcome))
        if self.observe is not None:
            self.observe(self.name, target.name, outcome)

    async def _probe(self, target: Target) -> None:
        """Readmission check of a target whose cooldown is over: its model is ready and its engine healthy."""
        runtime = target.runtime
        ok, reason = True, "ready"
        if runtime.chain is not None:  # a chain has no engine of its own: readmitted once a target of it can serve
            ok = runtime.chain.serving()
            self.outliers.probed(target, ok, "ready" if ok else "no target of it can serve")
            return
        try:
            # What a request would get (a pool that heals with traffic is usable while unhealthy).
            engine = runtime.usable_engine()
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                await engine.check_health()
        except ModelUnavailableError:
            ok, reason = False, f"state {runtime.state.value}"
        except Exception as exc:  # noqa: BLE001  # any failed health check keeps it out
            ok, reason = False, f"health check {type(exc).__name__}"
        self.outliers.probed(target, ok, reason)
