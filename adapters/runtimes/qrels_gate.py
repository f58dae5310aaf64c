"""The precision gate on the operator's own judgements (``qrels_set``): a reduced precision is
admitted only if its nDCG@10 on those judgements is within ``qrels_tolerance`` (relative) of the
reference precision's (fp32's).

The top-10 order gate (``adapters.runtimes.parity``) asks whether a cheaper precision ranks
exactly as fp32 does, which refuses swaps no user would notice; with judgements the question
becomes the one that matters -- does it rank the *relevant* documents as well. When a model
names a ``qrels_set`` this gate decides instead of the order rule.

The set is a BEIR directory (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``, read by
:mod:`adapters.runtimes.judgements`, as ``rerank-gateway eval`` reads it). Each judged query with
at least one relevant document (grade >= 1) becomes a golden query: its judged documents, then
documents drawn from the rest of the corpus (fixed seed) up to :data:`QRELS_DOCUMENTS`, so the
relevant ones have to be told from others even where the qrels judge only relevant documents (as
most BEIR sets do). Both precisions score the same set through the engine's request path.

nDCG@10 is trec_eval's (``ndcg_cut_10``: gain = grade, discount log2(rank + 1), the ideal from
the query's judgements), written out here (a dozen lines, checked against ranx in
tests/test_qrels_gate.py) rather than imported: ranx brings numba, pandas and scipy and compiles
on first use (tens of seconds) -- not a cost for an engine's start.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from adapters.base import EngineConfigError
from adapters.runtimes.judgements import JudgementError, load_beir
from adapters.runtimes.parity import GoldenQuery

__all__ = ("QRELS_DOCUMENTS", "QrelsSet", "QrelsVerdict", "judge", "ndcg_at_10", "read_qrels_set")

# Documents per golden query: the judged ones, then drawn ones up to this many.
QRELS_DOCUMENTS = 30
_SEED = 39


@dataclass(frozen=True)
class QrelsSet:
    source: str
    queries: list[GoldenQuery]
    grades: list[list[int]]  # per query, per document: its grade (0 for a drawn document)


def read_qrels_set(model: str, path: str, split: str = "test") -> QrelsSet:
    """The golden set of ``path``; a set that cannot be used is the model's one-line refusal."""
    try:
        judged = load_beir(path, split)
    except JudgementError as exc:
        raise EngineConfigError(f"model {model!r}: qrels_set: {exc}") from None
    rng = random.Random(_SEED)
    ids = sorted(judged.corpus)
    queries, grades = [], []
    for qid in sorted(judged.qrels):
        docs = dict(sorted(judged.qrels[qid].items()))
        if not any(g > 0 for g in docs.values()):
            continue  # nothing relevant: nDCG is 0 in any order, the query tells nothing
        room = min(QRELS_DOCUMENTS - len(docs), len(ids) - len(docs))
        drawn: list[str] = []
        while len(drawn) < room:
            pick = ids[rng.randrange(len(ids))]
            if pick not in docs and pick not in drawn:
                drawn.append(pick)
        order = [*docs, *drawn]
        queries.append(GoldenQuery(judged.queries[qid], [judged.corpus[d] for d in order]))
        grades.append([docs.get(d, 0) for d in order])
    if not queries:
        raise EngineConfigError(
            f"model {model!r}: qrels_set: {path}: no judged query has a relevant document (grade 1 or more)"
        )
    return QrelsSet(source=path, queries=queries, grades=grades)


def ndcg_at_10(grades: Sequence[int], scores: Sequence[float]) -> float:
    """trec_eval's nDCG@10 of one query. Equal scores keep input order (the gateway's own sort);
    a NaN score ranks last (a broken precision must not look ordered)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i] if not math.isnan(scores[i]) else math.inf)
    dcg = sum(grades[i] / math.log2(rank + 2) for rank, i in enumerate(order[:10]) if grades[i] > 0)
    ideal = sorted((g for g in grades if g > 0), reverse=True)[:10]
    idcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


@dataclass(frozen=True)
class QrelsVerdict:
    source: str
    queries: int
    reference: float  # mean nDCG@10 of the reference precision (fp32)
    reduced: float  # ... and of the reduced one
    tolerance: float  # relative

    @property
    def change(self) -> float:
        """Relative change of nDCG@10 from the reference (negative: a loss)."""
        return (self.reduced - self.reference) / self.reference if self.reference else 0.0

    @property
    def admitted(self) -> bool:
        return self.change >= -self.tolerance

    def line(self, precision: str, reference: str = "fp32") -> str:
        return (
            f"precision {precision!r} scores nDCG@10 {self.reduced:.4f} on the {self.queries} judged queries of "
            f"qrels_set {self.source}, {reference} {self.reference:.4f} ({self.change:+.2%}; qrels_tolerance "
            f"{self.tolerance:.2%})"
        )

    def figures(self) -> dict[str, Any]:
        """For ``/ready`` (engine_stats) and the log."""
        return {
            "qrels_set": self.source,
            "qrels_queries": self.queries,
            "ndcg@10_reference": round(self.reference, 6),
            "ndcg@10": round(self.reduced, 6),
            "ndcg@10_change": round(self.change, 6),
            "qrels_tolerance": self.tolerance,
            "admitted": self.admitted,
        }


def judge(
    qrels: QrelsSet, reference: Sequence[Sequence[float]], reduced: Sequence[Sequence[float]], *, tolerance: float
) -> QrelsVerdict:
    """Mean nDCG@10 of both precisions' scores of ``qrels.queries`` (in order) and the verdict."""
    n = len(qrels.grades)
    ref = sum(ndcg_at_10(g, s) for g, s in zip(qrels.grades, reference, strict=True)) / n
    red = sum(ndcg_at_10(g, s) for g, s in zip(qrels.grades, reduced, strict=True)) / n
    return QrelsVerdict(source=qrels.source, queries=n, reference=ref, reduced=red, tolerance=tolerance)
