"""``rerank-gateway eval``: ranking quality of the models a gateway serves, on the user's own judgements.

- :mod:`adapters.runtimes.judgements` -- BEIR directories and TREC qrels / run files, checked
  against each other (shared with the qrels precision gate, which runs inside engines).
- :mod:`gateway.eval.first_stage` -- the candidates: a TREC run file, else BM25 (bm25s).
- :mod:`gateway.eval.driver` -- one rerank request per (query, model), the models interleaved
  query by query, each request timed.
- :mod:`gateway.eval.metrics` -- nDCG@10, MRR@10, Recall@k per query and the paired
  significance tests, all computed by ranx.
- :mod:`gateway.eval.report` -- the JSON file, the Markdown report and the quality-vs-speed plot.
- :mod:`gateway.eval.command` -- the argparse subcommand.

Like ``gateway.bench`` (whose HTTP client, environment record, JSON writer and key redaction it
reuses), nothing here is imported by the gateway itself.
"""
