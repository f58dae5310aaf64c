"""``engine = "chain"``: one public model name routed to an ordered list of configured models.

How a request moves along the chain is ``gateway.serving.routing``'s; what each field means is
here (and in docs/routing.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .base import ModelName, Positive, PositiveFloat
from .references import ComposedModelConfig
from .upstream import DEFAULT_MAX_COOLDOWN_S

__all__ = ("ChainEngineConfig",)


class ChainEngineConfig(ComposedModelConfig, tag="chain", kw_only=True, frozen=True):
    """A public name served by the first of ``targets`` that can take the request.

    ``timeout_s`` is the deadline of the whole chain: every attempt runs within what is left of
    it, within its target's own ``timeout_s`` and, while another target remains to try, within
    ``attempt_timeout_s`` (default: half of what is left). ``max_concurrent_requests`` bounds the chain's
    requests; each target keeps its own bound too.
    """

    # Configured model names (or aliases), in order of preference; each is tried at most once per request.
    targets: Annotated[tuple[ModelName, ...], msgspec.Meta(min_length=1)]
    # What the targets' scores are: "replicas" (the same model, e.g. local GPUs and a pool of the
    # same checkpoint: scores comparable, any target's answer is cached) or "other-models" (e.g. a
    # local reranker and a hosted one: scores NOT comparable; only the first target's answers are
    # cached). No default: the operator says which.
    accepts: Literal["replicas", "other-models"]
    # "fallback": the first target that can answer serves. "spillover": also pass a target by while
    # it is saturated (spill_queue_depth / spill_wait_s), so the first takes all it can.
    mode: Literal["fallback", "spillover"] = "fallback"
    # Spill-over: pass a target by while its queue holds at least this many requests ...
    spill_queue_depth: Positive | None = None
    # ... or while its expected wait (its queue x its recent step times) is above this many seconds.
    spill_wait_s: PositiveFloat | None = None
    # The longest an attempt may run while another target remains to try. None: half of what is
    # left of timeout_s, so a target that hangs leaves the next one time to answer (and is ejected
    # like one that fails once it does so eject_after_failures times). The last attempt gets all
    # that is left. Set it to timeout_s to give every attempt the whole rest.
    attempt_timeout_s: PositiveFloat | None = None
    # Passive health, as a pool's replicas (adapters.outliers): a target failing this many
    # requests in a row is skipped for cooldown_s (doubling while it fails again, up to
    # max_cooldown_s), then readmitted once it is ready again.
    eject_after_failures: Positive = 3
    cooldown_s: PositiveFloat = 10.0  # see eject_after_failures
    max_cooldown_s: PositiveFloat | None = None  # None: 300 s, or cooldown_s if longer
    # Most of the chain skipped at once: the rest stays in rotation however it fails (a chain of
    # two may skip one).
    max_ejected_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5

    def __post_init__(self) -> None:
        spill = self.spill_queue_depth is not None or self.spill_wait_s is not None
        if self.mode == "spillover" and not spill:
            raise ValueError(
                'mode = "spillover" needs spill_queue_depth or spill_wait_s (when a target counts as saturated)'
            )
        if self.mode == "fallback" and spill:
            raise ValueError('spill_queue_depth / spill_wait_s apply to mode = "spillover" only; set mode or drop them')
        if self.max_cooldown_s is not None and self.max_cooldown_s < self.cooldown_s:
            raise ValueError(f"max_cooldown_s ({self.max_cooldown_s}) is below cooldown_s ({self.cooldown_s})")

    def references(self) -> tuple[tuple[str, str], ...]:
        return tuple((f"targets[{i}]", name) for i, name in enumerate(self.targets))

    @property
    def effective_max_cooldown_s(self) -> float:
        if self.max_cooldown_s is not None:
            return self.max_cooldown_s
        return max(DEFAULT_MAX_COOLDOWN_S, self.cooldown_s)
