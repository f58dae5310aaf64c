"""The ranking gate for FP8: bf16's top-10 order must survive on a golden set.

At load the engine scores a golden set with the bf16 weights, quantizes, scores again, and keeps
the quantized model only if the comparison of ``adapters.runtimes.parity`` (the rule OpenVINO's
bf16 / int8 are admitted by) passes: at least ``parity_min_agreement`` of the queries keep their
top-10 order, swaps of documents whose bf16 scores differ by less than ``parity_tie`` aside.

The golden set is the operator's own (``parity_set``, queries from real traffic: the verdict that
means most) or generated here from a seed, not downloaded: the same prompts on every machine.
Its documents are graded one by one (``parity.graded_golden_set``): document j holds
``max(0, 10 - j)`` of its query's ten words in a text of fixed length, so a trained reranker's
top 10 differ in relevance step by step instead of tying (a set where six documents share all of
a query's words makes the gate measure the order of equals). Random weights have no ranking to keep: there the gate measures noise and
refuses, which is the point of a gate.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from adapters.runtimes.parity import DOC_WORDS, GRADES, TOP_K, GoldenQuery, compare_rankings, graded_golden_set
from schemas.config import PARITY_MIN_AGREEMENT, PARITY_TIE

__all__ = ("DOC_WORDS", "GOLDEN_DOCS", "GOLDEN_QUERIES", "GRADES", "GateResult", "golden_set", "judge")

GOLDEN_QUERIES = 100
GOLDEN_DOCS = 30


def golden_set(n_queries: int | None = None, n_docs: int | None = None, seed: int = 24) -> list[GoldenQuery]:
    """The generated set (``parity.graded_golden_set``): ``GOLDEN_QUERIES`` x ``GOLDEN_DOCS`` unless told."""
    return graded_golden_set(
        queries=GOLDEN_QUERIES if n_queries is None else n_queries,
        documents=GOLDEN_DOCS if n_docs is None else n_docs,
        seed=seed,
    )


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
        return (
            f"precision = '{self.precision}' keeps bf16's top-{TOP_K} order on {self.kept:.1%} of the "
            f"{self.queries} golden queries ({self.golden}; needs {self.min_agreement:.0%}, swaps of scores "
            f"within {self.tie:g} aside; {self.mean_shared:.1f} of {TOP_K} top documents shared on average; "
            f"largest score change {self.max_abs_diff:.3g})"
        )


def judge(
    precision: str,
    base: Sequence[Sequence[float]],
    cand: Sequence[Sequence[float]],
    *,
    tie: float = PARITY_TIE,
    min_agreement: float = PARITY_MIN_AGREEMENT,
    golden: str = "generated",
) -> GateResult:
    """bf16's scores (``base``, one list per query) against the quantized model's (``cand``)."""
    if len(base) != len(cand) or not base:
        raise ValueError("one score list per query on both sides")
    report = compare_rankings(base, cand, tie=tie)
    return GateResult(
        precision=precision,
        golden=golden,
        queries=report.queries,
        kept=report.agreement,
        mean_shared=report.mean_shared,
        max_abs_diff=report.max_delta,
        tie=tie,
        min_agreement=min_agreement,
        passed=report.agreement >= min_agreement,
    )
