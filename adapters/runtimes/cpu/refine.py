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

Rounds (``refine``): a re-scored document's fp32 score is a point, not an interval of width
``2 * delta``, so one side of a close pair often settles it -- the other is then ordered once it
is more than ``delta`` (not ``2 * delta``) from that point. With ``rounds`` > 1 each round but the
last re-scores a vertex cover of the still-uncertain pairs (a side already exact forces the other;
then the document in most uncertain pairs first) and looks again; the last round re-scores every
unsettled side of every pair left, as the one-round rule does (so does any round that finds
scores bunched into more than ``_MAX_PAIRS`` open pairs). The argument, as long as every
reduced score is within ``delta`` of its fp32 one (the invariant: each document's fp32 score lies
in its interval, ``[s - delta, s + delta]`` or the exact point):

- intervals only shrink to points inside them, so the ``top``-th largest lower end (the floor)
  only rises and a pair found ordered stays ordered; no round adds uncertainty;
- when no uncertain pair is left among the candidates (documents whose upper end reaches the
  floor), ``top`` documents lie above every non-candidate in fp32, and any two candidates either
  have disjoint intervals (fp32 orders them as their values do), are both exact, or are a tie
  the gate sets aside -- set aside only while the pair's lower side, which keeps its reduced
  value, stays above every exact non-candidate (a document an earlier round re-scored and the
  risen floor left out: with the lower side under it, fp32's order of the two would be broken);
- the last round leaves no uncertain pair: every pair open before it has both sides exact after.

So the top order is fp32's after at most ``rounds`` rounds, and re-scores never more documents
than the one-round rule (a subset of the same pairs' sides); the gate checks the bound as before.

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

__all__ = ("refine", "refine_space")


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


# Open pairs past which a request's scores are bunched within the bound (random weights, 1000
# near-equal documents): the cover rounds would save a few documents at a quadratic cost, so the
# one-round rule (every open side at once, found in one scan) takes over.
_MAX_PAIRS = 256


class _Intervals:
    """Each item's interval (``[v - delta, v + delta]``, or the point ``v`` for an ``exact`` item),
    the candidates for the ``top`` (upper end at least the ``top``-th largest lower end), in
    value order, and which pairs of them fp32 could order otherwise than their values."""

    def __init__(
        self, values: Sequence[float], exact: set[int], *, delta: float, top: int, tied: Callable[[float, float], bool]
    ) -> None:
        n = len(values)
        self.values, self.exact, self.delta, self.tied = values, exact, delta, tied
        self.lo = [v if i in exact else v - delta for i, v in enumerate(values)]
        self.hi = [v if i in exact else v + delta for i, v in enumerate(values)]
        self.below = -math.inf
        if n <= 1 or top <= 0:
            self.candidates: list[int] = []
            return
        floor = sorted(self.lo, reverse=True)[min(top, n) - 1]
        # Stable: equal values keep input order, as the gateway's sort does.
        self.candidates = sorted((i for i in range(n) if self.hi[i] >= floor), key=lambda i: -values[i])
        # The highest value of an exact item that is no candidate (one re-scored in an earlier
        # round, left under the risen floor): a tie may set a pair aside only when its lower side
        # stays above it, else that side's value can sink below the item while fp32 puts it above
        # by more than a tie (open's comment).
        chosen = set(self.candidates)
        self.below = max((values[i] for i in exact if i not in chosen), default=-math.inf)

    def open(self, a: int, b: int) -> bool:
        """Whether fp32 may put ``b`` above ``a`` (``a``'s value >= ``b``'s) in a way the gate counts."""
        # <= : with delta 0 only exact ties are open (two points, both exact, are settled).
        # fp32 puts b above a only with both scores in the intervals' overlap [lo[a], hi[b]]: a
        # swap the gate sets aside there is no reason to re-score.
        # The tie holds for a and b only: b keeps its value, anywhere in its interval, so it must
        # also stay above every exact non-candidate (``below``); an unexact one lies under the
        # floor by more than delta, below any candidate's value.
        return (
            self.lo[a] <= self.hi[b]
            and not (a in self.exact and b in self.exact)
            and not (self.values[b] > self.below and self.tied(self.lo[a], self.hi[b]))
        )

    def pairs(self, limit: int) -> list[tuple[int, int]] | None:
        """The open pairs ``(a, b)``, ``a``'s value >= ``b``'s; None past ``limit`` of them."""
        c, v, out = self.candidates, self.values, []
        for x, a in enumerate(c):
            for b in c[x + 1 :]:
                if v[a] - v[b] > 2 * self.delta:
                    break  # every later candidate is lower still: ordered whatever its interval
                if self.open(a, b):
                    out.append((a, b))
                    if len(out) > limit:
                        return None
        return out

    def items(self) -> set[int]:
        """Every item in an open pair: each candidate looks at its neighbours within ``2 * delta``
        above and below until it finds one it may swap with (one scan, however many pairs)."""
        c, v, out = self.candidates, self.values, set()
        for x, a in enumerate(c):
            for y in range(x - 1, -1, -1):  # above a
                if v[c[y]] - v[a] > 2 * self.delta:
                    break
                if self.open(c[y], a):
                    out.add(a)
                    break
            if a in out:
                continue
            for b in c[x + 1 :]:  # below a
                if v[a] - v[b] > 2 * self.delta:
                    break
                if self.open(a, b):
                    out.add(a)
                    break
        return out


def _cover(pairs: list[tuple[int, int]], exact: set[int]) -> list[int]:
    """Items that touch every pair: a pair with one side exact needs its other side; of the rest,
    the item in most pairs first (index order among equals, so a request's picks repeat)."""
    pick = {b if a in exact else a for a, b in pairs if a in exact or b in exact}
    left = [p for p in pairs if p[0] not in pick and p[1] not in pick]
    while left:
        count: dict[int, int] = {}
        for p in left:
            for v in p:
                count[v] = count.get(v, 0) + 1
        best = min(count, key=lambda v: (-count[v], v))
        pick.add(best)
        left = [p for p in left if best not in p]
    return sorted(pick)


def refine(
    scores: Sequence[float],
    *,
    delta: float,
    top: int,
    exact: Callable[[list[int]], Sequence[float]],
    rounds: int = 1,
    tied: Callable[[float, float], bool] = _never,
) -> tuple[list[float], int]:
    """``scores`` (each within ``delta`` of its fp32 score) with the items whose ``top`` order the
    bound leaves open replaced by ``exact(indices)`` (their fp32 scores), over at most ``rounds``
    rounds (the module doc argues the result's top order is fp32's); and how many were re-scored.

    ``tied(lo, hi)``: whether any two fp32 scores in ``[lo, hi]`` are a tie the parity gate sets
    aside (a sigmoid near 0 or 1 maps several logits within its 1e-3); a pair that can only swap
    within such a range is not re-scored."""
    values = list(scores)
    known: set[int] = set()
    for n in range(1, max(rounds, 1) + 1):
        now = _Intervals(values, known, delta=delta, top=top, tied=tied)
        pairs = now.pairs(_MAX_PAIRS) if n < rounds else None
        if pairs is not None:
            pick = _cover(pairs, known)  # empty: nothing open
        else:
            pick = sorted(now.items() - known)  # the last round (or too many pairs): every open side
        if not pick:
            break
        for i, value in zip(pick, exact(pick), strict=True):
            values[i] = value
        known.update(pick)
        if pairs is None:
            break  # every open pair now has both sides exact
    return values, len(known)
