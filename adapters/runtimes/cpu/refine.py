"""Refinement: a reduced precision scores every document, fp32 re-scores the few it cannot order.

bf16 and int8 change a trained reranker's logits by a small share of their range (bf16 on
all-MiniLM-L6 with a head spread over -11..+11: median 0.07, largest 0.3), yet a query's top-10
almost always holds two neighbours closer than that, so on its own no reduced precision keeps
the strict top-10 order (docs/cpu-runtimes.md, measured). But the error is bounded: with
``delta`` the largest change measured at start (times a margin), a document's fp32 score lies
within ``delta`` of its reduced one. Then

- a document whose reduced score is below the ``top``-th best by more than ``2 * delta`` cannot
  be in the fp32 top (``top`` documents score above it in fp32 too), and
- two candidates whose reduced scores are ``2 * delta`` apart or more are in fp32's order,

so re-scoring in fp32 just the candidates that have a neighbour closer than ``2 * delta`` gives
fp32's top order exactly, as long as the bound holds; the parity gate checks that it does, on
golden queries other than those ``delta`` was measured on. Scores of the documents not
re-scored stay the reduced ones (within ``delta`` of fp32's).

Items are what the engine scores: for a document cut into chunks the guarantee is on the
chunks' order (the document's score is its best chunk's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import msgspec

from adapters.base import ScoreJob
from adapters.families.cross_encoder import CrossEncoderFamily
from adapters.families.encoder import EncoderFamily

__all__ = ("refine_space", "uncertain")


def refine_space(family: EncoderFamily, job: ScoreJob) -> tuple[ScoreJob, Callable[[float], float]]:
    """The job whose scores refinement orders, and the map from them to ``job``'s scores.

    The model's raw outputs (a logit, a cosine) where the score is a monotone function of
    them: a reduced precision's error is about even over their range, while a sigmoid
    squeezes it into the middle (one bound over sigmoid scores is loose at both ends)."""
    if job.raw_scores:
        return job, _same
    if isinstance(family, CrossEncoderFamily):
        if family.num_labels > 1 and family.activation == "softmax":
            return job, _same  # several logits make the score: order the scores themselves
        return msgspec.structs.replace(job, raw_scores=True), _sigmoid
    return msgspec.structs.replace(job, raw_scores=True), _half_cosine


def _same(x: float) -> float:
    return x


def _sigmoid(x: float) -> float:
    # The cross-encoder's activation (as torch.sigmoid computes it, in float32 there).
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _half_cosine(x: float) -> float:
    return (1.0 + x) / 2.0  # the bi-encoder's score of a cosine


def _never(lo: float, hi: float) -> bool:
    return False


def uncertain(
    scores: Sequence[float], *, delta: float, top: int, tied: Callable[[float, float], bool] = _never
) -> list[int]:
    """Indices (ascending) of the items to re-score in fp32 so the ``top`` order is exact,
    given reduced ``scores`` each within ``delta`` of its fp32 score.

    ``tied(lo, hi)``: whether any two fp32 scores in ``[lo, hi]`` are a tie the parity gate sets
    aside (a sigmoid near 0 or 1 maps several logits within its 1e-3); such neighbours may
    swap, so they are not re-scored."""
    n = len(scores)
    if n <= 1 or top <= 0:
        return []
    order = sorted(range(n), key=lambda i: -scores[i])
    floor = scores[order[min(top, n) - 1]] - 2 * delta
    candidates = [i for i in order if scores[i] >= floor]
    pick: set[int] = set()
    for a, b in zip(candidates, candidates[1:], strict=False):
        # <= : with delta 0 only exact ties are re-scored; a gap of exactly 2*delta may still invert.
        if scores[a] - scores[b] <= 2 * delta and not tied(scores[b] - delta, scores[a] + delta):
            pick.update((a, b))
    return sorted(pick)
