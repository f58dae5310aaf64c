"""``rerank-gateway bench``: drive any Cohere/Jina-compatible rerank endpoint with a described load.

- :mod:`gateway.bench.workload` -- deterministic requests with lengths in tokens (fixed, uniform
  range or a file of texts), duplicate share, top_n, instruction.
- :mod:`gateway.bench.driver` -- closed-loop (concurrency) and open-loop (rate) HTTP drivers on
  httpx, and the ``--compare`` mode that alternates two endpoints round by round.
- :mod:`gateway.bench.report` -- statistics, the JSON file, the Markdown report and the PNG plots.
- :mod:`gateway.bench.command` -- the argparse subcommand.

Nothing here is imported by the gateway itself: ``gateway.cli`` imports the command lazily, so
serving never loads matplotlib or tqdm.
"""
