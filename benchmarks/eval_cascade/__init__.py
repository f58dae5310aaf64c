"""The data, models and config of docs/benchmarks/eval-2026-12-04-cascade (``prepare``)."""
