"""The ranking gate for reduced precision: bf16's top-10 order must survive on a golden set.

At load the engine scores a fixed golden set (queries, each with documents of graded overlap
with it) with the bf16 weights, quantizes, scores again, and keeps the quantized model only if
the top-10 order of >= 99 % of the queries is the same. The set is generated from a seed, not
downloaded: the same prompts on every machine, and documents that share 0-4 of the query's
words so a trained reranker spreads their scores over a range (random weights do not: there
the gate measures noise and usually refuses, which is the point of a gate).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

__all__ = ("GOLDEN_QUERIES", "GateResult", "golden_set", "judge", "top_k_kept")

GOLDEN_QUERIES = 100
GOLDEN_DOCS = 30
TOP_K = 10
MIN_KEPT = 0.99

_WORDS = """apple river mountain engine battery protein galaxy violin harbor glacier copper wheat
tunnel orbit fever castle bridge desert forest lantern market pepper rocket saddle turbine volcano
whale yogurt zinc anchor basket canyon dolphin eclipse falcon garlic hammer island jungle kettle
lemon magnet needle oyster parrot quartz rabbit salmon tomato umbrella velvet walnut lizard
algebra ballot climate diesel enzyme fossil genome harvest insulin justice kernel lattice mortgage
neuron ozone pension quantum reactor satellite tariff uranium vaccine warranty yeast zoning
printer router compiler database firewall laptop monitor network password server keyboard""".split()  # noqa: SIM905  # prose reads better


def golden_set(n_queries: int | None = None, n_docs: int | None = None, seed: int = 24) -> list[tuple[str, list[str]]]:
    """``n_queries`` (query, documents) pairs; document j shares ``j % 5`` of its query's words."""
    n_queries = GOLDEN_QUERIES if n_queries is None else n_queries
    n_docs = GOLDEN_DOCS if n_docs is None else n_docs
    rng = random.Random(seed)
    out = []
    for _ in range(n_queries):
        topic = rng.sample(_WORDS, 4)
        query = f"what is known about {topic[0]} and {topic[1]} near the {topic[2]} {topic[3]}?"
        docs = []
        for j in range(n_docs):
            shared = topic[: j % 5]
            filler = rng.sample([w for w in _WORDS if w not in topic], rng.randint(8, 40))
            words = shared + filler
            rng.shuffle(words)
            docs.append(" ".join(words) + ".")
        out.append((query, docs))
    return out


def _top(scores: Sequence[float], k: int) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:k]


def top_k_kept(base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], k: int = TOP_K) -> float:
    """Fraction of queries whose ``k`` best documents come in the same order under ``cand`` as under ``base``."""
    if len(base) != len(cand) or not base:
        raise ValueError("one score list per query on both sides")
    return sum(_top(b, k) == _top(c, k) for b, c in zip(base, cand, strict=True)) / len(base)


class GateResult(msgspec.Struct, frozen=True):
    precision: str
    queries: int
    kept: float  # fraction of queries with bf16's top-10 order
    max_abs_diff: float  # largest score change on the set
    passed: bool

    def line(self) -> str:
        return (f"precision = '{self.precision}' keeps bf16's top-{TOP_K} order on {self.kept:.1%} of the "
                f"{self.queries} golden queries (needs {MIN_KEPT:.0%}; largest score change {self.max_abs_diff:.3g})")


def judge(precision: str, base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]]) -> GateResult:
    kept = top_k_kept(base, cand)
    diff = max(abs(a - b) for bs, cs in zip(base, cand, strict=True) for a, b in zip(bs, cs, strict=True))
    return GateResult(precision=precision, queries=len(base), kept=kept, max_abs_diff=diff, passed=kept >= MIN_KEPT)
