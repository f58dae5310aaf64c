"""A zero-cost engine: fixed scores, no model, no dependencies.

For tests of the HTTP layer and for measuring the gateway's own overhead (``rerank-gateway
bench`` against a ``static`` model measures everything but inference). Scores come from the
config: ``scores`` maps exact document texts to scores, every other document gets ``score``.
Raw scores (``ScoreJob.raw_scores``) are the logits of those scores, as a cross-encoder's raw
output is the logit whose sigmoid is its score; ``supports_raw_scores = false`` in the config makes it an
engine without raw output, so both paths of the dialects that ask for raw scores can be tested.
"""

from __future__ import annotations

import asyncio
import math

from adapters.base import EngineObserver, ScoreJob, ScoreResult
from schemas.config import StaticEngineConfig

__all__ = ("StaticEngine",)


class StaticEngine:
    """:class:`adapters.base.RerankEngine` returning configured scores."""

    tokenizer = None

    def __init__(self, config: StaticEngineConfig) -> None:
        self._default = config.score
        self._scores = dict(config.scores)
        self._delay = config.delay_s
        self.supports_raw_scores = config.supports_raw_scores
        self.observer: EngineObserver | None = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def check_health(self) -> None:
        return None

    async def score(self, job: ScoreJob) -> ScoreResult:
        if self._delay:
            await asyncio.sleep(self._delay)
        scores = [self._scores.get(text, self._default) for text in job.texts]
        if job.raw_scores:
            scores = [_logit(s) for s in scores]
        # Spaces + 1 per text: a deterministic stand-in for a token count that stays cheap
        # (str.split allocated every word: a third of the gateway's per-request CPU in `bench`).
        tokens = sum(text.count(" ") + 1 for text in job.texts) + (job.query.count(" ") + 1) * job.size
        if self.observer is not None:  # one simulated step per job, so metrics see static traffic
            self.observer.step(rows=job.size, tokens=tokens)
        return ScoreResult(scores=scores, input_tokens=tokens)


def _logit(p: float) -> float:
    # Scores 0 and 1 would be infinite logits, which JSON cannot carry: clamp first.
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))
