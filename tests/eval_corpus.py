"""A generated BEIR directory with graded judgements, for ``rerank-gateway eval`` and the qrels gate.

Built from the parity gate's graded golden set (``adapters.runtimes.parity.graded_golden_set``):
query j names ten topic words; its document i holds ``max(0, 10 - i)`` of them among 30 words.
Relevance is how many of the query's words a document holds, graded 3 (8-10), 2 (5-7), 1 (2-4),
0 (0-1, judged not relevant). Every query's documents are in one corpus, so BM25 and the
rerankers also see the other queries' documents.
"""

from __future__ import annotations

import json
from pathlib import Path

from adapters.runtimes.parity import graded_golden_set

__all__ = ("grade", "write_beir")


def grade(shared: int) -> int:
    return 3 if shared >= 8 else 2 if shared >= 5 else 1 if shared >= 2 else 0


def write_beir(root: Path, *, queries: int = 8, documents: int = 16, seed: int = 24) -> Path:
    """``root`` as a BEIR directory (corpus.jsonl, queries.jsonl, qrels/test.tsv)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    golden = graded_golden_set(queries=queries, documents=documents, seed=seed)
    corpus, qlines, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for j, g in enumerate(golden):
        qid = f"q{j}"
        qlines.append(json.dumps({"_id": qid, "text": g.query}))
        for i, text in enumerate(g.documents):
            did = f"q{j}-d{i}"
            corpus.append(json.dumps({"_id": did, "title": "", "text": text}))
            qrels.append(f"{qid}\t{did}\t{grade(max(0, 10 - i))}")
    (root / "corpus.jsonl").write_text("\n".join(corpus) + "\n")
    (root / "queries.jsonl").write_text("\n".join(qlines) + "\n")
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    return root
