"""Quality figures, all computed by ranx: nDCG@10, MRR@10 and Recall@k per query and over the
queries, and the paired significance test of every pair of systems (first stage included).

Why ranx: its metrics are the TREC definitions (``ndcg`` is trec_eval's ``ndcg_cut``, linear
gains, as BEIR reports; a document counts as relevant from grade 1), it computes every query's
value (the report keeps them), and it carries the paired tests itself -- Student's t and Fisher's
randomization test (seeded) -- so the p-values come from the same library as the figures.
ir-measures has no significance tests, and pytrec_eval has no wheel here (docs/evaluate.md).

Ranks, not scores, go to ranx: each system's documents get ``n, n-1, ...`` in the order the
system returned them, so equal scores are broken exactly as the gateway broke them (by the order
sent) rather than by whichever order ranx's sort leaves equals in.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ("as_ranks", "metric_names", "score_systems")


def metric_names(recall_at: Sequence[int]) -> list[str]:
    return ["ndcg@10", "mrr@10", *(f"recall@{k}" for k in recall_at)]


def as_ranks(order: Sequence[str]) -> dict[str, float]:
    """Document id -> ``len(order) - position``: ranx orders by it exactly as ``order`` is."""
    return {doc: float(len(order) - i) for i, doc in enumerate(order)}


def score_systems(
    qrels: dict[str, dict[str, int]],
    orders: dict[str, dict[str, list[str]]],
    metrics: list[str],
    *,
    stat_test: str = "student",
    max_p: float = 0.05,
) -> dict[str, Any]:
    """``orders``: system -> query id -> document ids best first.

    Returns ``{"mean": {system: {metric: value}}, "per_query": {system: {metric: {qid: value}}},
    "tests": [{"a", "b", "metric", "delta", "p_value", "significant"}]}`` -- ``delta`` is b's mean
    minus a's over the same queries, ``p_value`` ranx's (NaN when every query ties)."""
    from ranx import Qrels, Run, compare  # type: ignore[import-untyped]

    judged = Qrels({q: dict(docs) for q, docs in qrels.items()})
    runs = [Run({q: as_ranks(o) for q, o in by_query.items()}, name=name) for name, by_query in orders.items()]
    with warnings.catch_warnings():
        # scipy's "catastrophic cancellation" when two systems score (nearly) alike on every query
        # (the p-value says so) and numba's casts inside ranx: not the user's to act on.
        warnings.simplefilter("ignore")
        report = compare(
            judged, runs, metrics, stat_test=stat_test, max_p=max_p, make_comparable=True, rounding_digits=6, threads=1
        )
    mean = {run.name: {m: float(report.results[run.name][m]) for m in metrics} for run in runs}
    per_query = {run.name: {m: {q: float(v) for q, v in run.scores[m].items()} for m in metrics} for run in runs}
    tests = []
    names = [run.name for run in runs]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for m in metrics:
                found = report.comparisons[frozenset([a, b])][m]
                p = float(found["p_value"])
                tests.append(
                    {
                        "a": a,
                        "b": b,
                        "metric": m,
                        "delta": mean[b][m] - mean[a][m],
                        "p_value": p,
                        "significant": bool(not math.isnan(p) and p <= max_p),
                    }
                )
    return {"mean": mean, "per_query": per_query, "tests": tests, "stat_test": stat_test, "max_p": max_p}
