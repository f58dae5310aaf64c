"""The ranking gate for FP8: bf16's top-10 order must survive on a golden set.

At load the engine scores a golden set with the bf16 weights, quantizes, scores again, and keeps
the quantized model only if the comparison of ``adapters.runtimes.parity`` (the rule OpenVINO's
bf16 / int8 are admitted by) passes: at least ``parity_min_agreement`` of the queries keep their
top-10 order, swaps of documents whose bf16 scores differ by less than ``parity_tie`` aside.

The golden set is the operator's own (``parity_set``, queries from real traffic: the verdict that
means most) or generated here from a seed, not downloaded: the same prompts on every machine.
Its documents are graded one by one: document j holds ``max(0, 10 - j)`` of its query's ten
words in a text of fixed length, so a trained reranker's top 10 differ in relevance step by step
instead of tying (a set where six documents share all of a query's words makes the gate measure
the order of equals). Random weights have no ranking to keep: there the gate measures noise and
refuses, which is the point of a gate.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from adapters.runtimes.parity import TOP_K, GoldenQuery, compare_rankings
from schemas.config import PARITY_MIN_AGREEMENT, PARITY_TIE

__all__ = ("GOLDEN_DOCS", "GOLDEN_QUERIES", "GRADES", "GateResult", "golden_set", "judge")

GOLDEN_QUERIES = 100
GOLDEN_DOCS = 30
GRADES = TOP_K  # query words, so that the top 10 hold 10, 9, ... 1 of them
DOC_WORDS = 30  # every document's length: relevance is density, not length

_WORDS = """apple river mountain engine battery protein galaxy violin harbor glacier copper wheat
tunnel orbit fever castle bridge desert forest lantern market pepper rocket saddle turbine volcano
whale yogurt zinc anchor basket canyon dolphin eclipse falcon garlic hammer island jungle kettle
lemon magnet needle oyster parrot quartz rabbit salmon tomato umbrella velvet walnut lizard
algebra ballot climate diesel enzyme fossil genome harvest insulin justice kernel lattice mortgage
neuron ozone pension quantum reactor satellite tariff uranium vaccine warranty yeast zoning
printer router compiler database firewall laptop monitor network password server keyboard""".split()  # noqa: SIM905  # prose reads better


def golden_set(n_queries: int | None = None, n_docs: int | None = None, seed: int = 24) -> list[GoldenQuery]:
    """``n_queries`` queries of ``GRADES`` words; document j shares ``max(0, GRADES - j)`` of them."""
    n_queries = GOLDEN_QUERIES if n_queries is None else n_queries
    n_docs = GOLDEN_DOCS if n_docs is None else n_docs
    rng = random.Random(seed)
    out = []
    for _ in range(n_queries):
        topic = rng.sample(_WORDS, GRADES)
        query = f"which documents mention {', '.join(topic[:-1])} and {topic[-1]}?"
        others = [w for w in _WORDS if w not in topic]
        docs = []
        for j in range(n_docs):
            shared = rng.sample(topic, max(0, GRADES - j))
            words = shared + rng.sample(others, DOC_WORDS - len(shared))
            rng.shuffle(words)
            docs.append(" ".join(words) + ".")
        out.append(GoldenQuery(query, docs))
    return out


class GateResult(msgspec.Struct, frozen=True):
    precision: str
    golden: str  # "generated", or the parity_set file the queries came from
    queries: int
    kept: float  # share of the queries that keep bf16's top-10 order
    mean_shared: float  # documents of bf16's top 10 also in the quantized top 10, on average
    max_abs_diff: float  # largest score change on the set (inf where a score turned NaN)
    tie: float
    min_agreement: float
    passed: bool

    def line(self) -> str:
        return (f"precision = '{self.precision}' keeps bf16's top-{TOP_K} order on {self.kept:.1%} of the "
                f"{self.queries} golden queries ({self.golden}; needs {self.min_agreement:.0%}, swaps of scores "
                f"within {self.tie:g} aside; {self.mean_shared:.1f} of {TOP_K} top documents shared on average; "
                f"largest score change {self.max_abs_diff:.3g})")


def judge(precision: str, base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], *,
          tie: float = PARITY_TIE, min_agreement: float = PARITY_MIN_AGREEMENT, golden: str = "generated") -> GateResult:
    """bf16's scores (``base``, one list per query) against the quantized model's (``cand``)."""
    if len(base) != len(cand) or not base:
        raise ValueError("one score list per query on both sides")
    report = compare_rankings(base, cand, tie=tie)
    return GateResult(precision=precision, golden=golden, queries=report.queries, kept=report.agreement,
                      mean_shared=report.mean_shared, max_abs_diff=report.max_delta, tie=tie,
                      min_agreement=min_agreement, passed=report.agreement >= min_agreement)
