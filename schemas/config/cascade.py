"""``engine = "cascade"``: one public model name whose documents pass through configured models
in turn, each keeping its best ``keep`` for the next (a fast reranker narrows 1,000 documents to
50, an accurate one orders those 50).

How a request moves through the stages is ``gateway.serving.routing.cascade``'s; what the answer
holds is documented there and in docs/evaluate.md.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .base import ModelName, Positive, _Strict
from .references import ComposedModelConfig

__all__ = ("CascadeEngineConfig", "CascadeStage")


class CascadeStage(_Strict, frozen=True):
    # A configured model's name (or alias); a chain routes by its own rules.
    model: ModelName
    # The documents this stage passes to the next: its best this-many. Every stage but the last
    # sets it; the last stage's order (and scores) is the answer.
    keep: Positive | None = None


class CascadeEngineConfig(ComposedModelConfig, tag="cascade", kw_only=True, frozen=True):
    """Stages of configured models; ``timeout_s`` bounds the whole cascade (each stage also keeps
    its own model's ``timeout_s`` and admission bound); ``max_concurrent_requests`` the cascade's
    own requests."""

    # In order, each {model = a configured model's name or alias, keep = how many of its best
    # documents the next stage gets (every stage but the last)}: the first stage scores every
    # document, each next one what the one before kept; e.g. [{model = "fast", keep = 50}, {model = "accurate"}].
    stages: Annotated[tuple[CascadeStage, ...], msgspec.Meta(min_length=2)]

    def __post_init__(self) -> None:
        *first, last = self.stages
        for i, stage in enumerate(first):
            if stage.keep is None:
                raise ValueError(
                    f"stages[{i}] ({stage.model}): keep is required on every stage but the last "
                    "(how many of its best documents the next stage gets)"
                )
        if last.keep is not None:
            raise ValueError(
                f"stages[{len(first)}] ({last.model}): the last stage orders every document it gets; "
                "drop its keep (a request's top_n cuts the answer)"
            )
        keeps = [stage.keep or 0 for stage in first]
        for i in range(1, len(keeps)):
            if keeps[i] > keeps[i - 1]:
                raise ValueError(
                    f"stages[{i}].keep ({keeps[i]}) is above stages[{i - 1}].keep ({keeps[i - 1]}): "
                    "a stage only gets what the one before kept"
                )

    def references(self) -> tuple[tuple[str, str], ...]:
        return tuple((f"stages[{i}]", stage.model) for i, stage in enumerate(self.stages))
