"""The candidates each query's reranking starts from: the top ``depth`` documents of a TREC run
file, else of BM25 over the corpus (bm25s: sparse-matrix BM25 in numpy, a well-kept library,
instead of an index of our own). Both keep their own scores, so the report shows what the
rerankers add to the first stage."""

from __future__ import annotations

from adapters.runtimes.judgements import Judgements

__all__ = ("bm25_run", "top")

Run = dict[str, dict[str, float]]


def top(run: Run, depth: int) -> dict[str, list[tuple[str, float]]]:
    """Each query's ``depth`` best documents, best first (equal scores: by document id, so the
    same files always give the same candidates)."""
    return {qid: sorted(docs.items(), key=lambda d: (-d[1], d[0]))[:depth] for qid, docs in run.items()}


def bm25_run(judgements: Judgements, depth: int) -> Run:
    """BM25 (bm25s' defaults: Lucene's variant, k1 = 1.5, b = 0.75) with English stopwords removed."""
    import bm25s  # type: ignore[import-untyped]

    ids = list(judgements.corpus)
    index = bm25s.BM25()
    index.index(
        bm25s.tokenize([judgements.corpus[i] for i in ids], stopwords="en", show_progress=False), show_progress=False
    )
    qids = list(judgements.queries)
    tokens = bm25s.tokenize([judgements.queries[q] for q in qids], stopwords="en", show_progress=False)
    found, scores = index.retrieve(tokens, k=min(depth, len(ids)), show_progress=False)
    return {
        qid: {ids[int(d)]: float(s) for d, s in zip(found[i], scores[i], strict=True)} for i, qid in enumerate(qids)
    }
