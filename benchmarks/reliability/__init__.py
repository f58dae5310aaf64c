"""Reliability suite, long part: a soak and fault injection against real processes.

    python -m benchmarks.reliability --clients 16 --soak-s 120 --out docs/reliability

Writes ``<out>/<UTC date>/reliability.json`` and ``reliability.md``. Sections (``--only`` picks):

- ``soak``: N clients x T seconds of valid rerank requests (1-100 documents) against a real
  gateway process (``static`` engine: the gateway's own code is what runs), RSS every second;
  every request of :mod:`benchmarks.reliability.hostile` before and after it (the default
  limits, 10,000 documents, 20 MiB): no 5xx, every 4xx a JSON body.
- ``upstream``: a pool over two stub replicas under load; one is killed (SIGKILL), then
  replaced by a slow one (1 s per request): errors and p99 per phase.
- ``failover``: a fallback chain over two pools under load, its primary killed then restarted:
  errors and p50/p99 per phase, which target served, and the time until the primary is
  preferred again (:mod:`benchmarks.reliability.failover`).
- ``redis``: per-key limits in Redis; Redis killed under load then restarted, with
  ``redis_failure = "closed"`` (503 + Retry-After meanwhile) and ``"open"`` (keeps serving).
- ``sigterm``: SIGTERM with requests in flight: every one is answered, then the process exits.
- ``engine``: the vLLM engine on CPU (tiny random Qwen3, ``vllm-score``) killed under load:
  every request gets exactly one response, 503 + Retry-After meanwhile; recovery time. Holds
  ``/tmp/vllm.lock`` so two vLLM engines never start at once on a shared machine.

"Recovery" is the time from the fault's end (process back, or the kill for self-healing
faults) to the first 200. Every request's outcome is counted: a request without a response
(exception, timeout) is "lost". The ``fuzz`` section (memory over two identical fuzz passes,
``fuzz_memory.py``) was removed on 2026-12-05, answered in reliability 2026-12-01.
"""
