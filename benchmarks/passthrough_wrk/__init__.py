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
``server.workers = 1`` and ``= N`` under uvicorn (``gateway-1w``, ``gateway-Nw``) and, with
``--runners uvicorn,granian``, the same configs under ``server.runner = "granian"``
(``gateway-granian-1w``, ``gateway-granian-Nw``), LiteLLM proxy with one worker (``LITELLM_VENV``: a venv
holding ``litellm[proxy]``; it is not a dependency of this project). A py-spy profile of the
one-worker gateway at 32 clients (when py-spy is installed) is grouped by component.
Writes ``passthrough_wrk.json`` and ``passthrough_wrk.md`` into ``--out``.
"""

# The wrk client, the process-tree readings, the profile, the run and the report live in the
# modules below. The names are handed on here ("X as X": a re-export outside ``__all__``), the
# private ones too: the scripts beside the dated reports import them from here.
from benchmarks.passthrough_wrk.host import _idle_cpu as _idle_cpu
from benchmarks.passthrough_wrk.host import _loadavg as _loadavg
from benchmarks.passthrough_wrk.host import _signal_tree as _signal_tree
from benchmarks.passthrough_wrk.host import _switches as _switches
from benchmarks.passthrough_wrk.host import _tree as _tree
from benchmarks.passthrough_wrk.pyspy_profile import _component as _component
from benchmarks.passthrough_wrk.pyspy_profile import _profile as _profile
from benchmarks.passthrough_wrk.report import GATEWAYS as GATEWAYS
from benchmarks.passthrough_wrk.report import ONE_WORKER as ONE_WORKER
from benchmarks.passthrough_wrk.report import TARGETS as TARGETS
from benchmarks.passthrough_wrk.report import render as render
from benchmarks.passthrough_wrk.report import summarize as summarize
from benchmarks.passthrough_wrk.run import main
from benchmarks.passthrough_wrk.wrk import _body as _body
from benchmarks.passthrough_wrk.wrk import _lua as _lua
from benchmarks.passthrough_wrk.wrk import _wrk as _wrk
from benchmarks.passthrough_wrk.wrk import parse_wrk

__all__ = ("main", "parse_wrk")
