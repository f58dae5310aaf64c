"""Passthrough at 1 and 32 clients with wrk: the gateway's pool engine (1 and N workers) vs LiteLLM.

    .venv/bin/python -m benchmarks.passthrough_wrk --out docs/benchmarks/cpu-$(date +%F)

Targets, all in front of the same zero-work stub (``benchmarks.stub_upstream``) with the same
100-document body: the bare stub (for added latency), the gateway with ``server.workers`` 1 and
N, with ``--chain`` the same model behind a fallback chain, and LiteLLM proxy (``--litellm-venv``,
not a dependency). Per round, level and target (order rotated) one bounded wrk run (or
``--client python``); CPU per request is the target's process-tree CPU seconds from /proc over
the completed requests; ratios are per round, their median reported. Writes
``passthrough_wrk.json`` and ``passthrough_wrk.md``. Removed on 2026-12-05, answered in their
reports: ``--runners granian`` (cpu-2026-12-01-granian), ``--spinners`` and the py-spy profile
(cpu-2026-12-01-paused, -direct), the chain's in-process measure (routing-2026-12-04) and
``overhead`` (cpu-2026-12-01-direct, tracing-2026-12-04).
"""

from benchmarks.passthrough_wrk.run import main
from benchmarks.passthrough_wrk.wrk import parse_wrk

__all__ = ("main", "parse_wrk")
