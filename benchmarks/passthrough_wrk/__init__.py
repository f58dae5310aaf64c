"""Passthrough at 1 and 32 clients with wrk: the gateway's pool engine (1 and N workers) vs LiteLLM.

    .venv/bin/python -m benchmarks.passthrough_wrk --out docs/benchmarks/cpu-$(date +%F)

All targets sit in front of the same zero-work Cohere-shaped stub (``benchmarks.stub_upstream``)
on loopback and get the same 100-document body with ``top_n`` = 10. wrk (Debian package ``wrk``;
C, one thread, a few µs of CPU per request) is the client, so the client's own cost barely
shows. For every round, concurrency level and target (order rotated each round), one bounded
wrk run is made and the CPU seconds the target's process tree used during it are read from
/proc: CPU per request is that over the requests wrk completed. Ratios are taken per round
(the pair ran seconds apart) and the report gives their median, since the box is shared.

Targets: the bare stub (the upstream alone, for added latency), the gateway with
``server.workers = 1`` and ``= N`` (``gateway-1w``, ``gateway-Nw``), with ``--chain`` the same
model behind a fallback chain (``gateway-chain-1w``), and LiteLLM proxy with one worker
(``--litellm-venv``: a venv holding ``litellm[proxy]``; it is not a dependency of this project).
Writes ``passthrough_wrk.json`` and ``passthrough_wrk.md`` into ``--out``.

Removed on 2026-12-05, answered in their reports: ``--runners granian`` (cpu-2026-12-01-granian:
uvicorn stays the default), ``--spinners`` (cpu-2026-12-01-paused: idle vCPUs waking) and the
py-spy profile (``--profile-seconds``; cpu-2026-12-01-paused, -direct), and ``--chain``'s
in-process measure of the chain's CPU (``chain_inprocess.py``; routing-2026-12-04: +4.5 µs).
"""

from benchmarks.passthrough_wrk.run import main
from benchmarks.passthrough_wrk.wrk import parse_wrk

__all__ = ("main", "parse_wrk")
