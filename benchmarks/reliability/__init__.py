"""Reliability suite, long part: a soak and fault injection against real processes.

    python -m benchmarks.reliability --clients 16 --soak-s 120 --out docs/reliability

Writes ``<out>/<UTC date>/reliability.json`` and ``reliability.md``. Sections (``--only`` picks):

- ``soak``: N clients x T seconds of valid requests against a gateway process (``static``
  engine), RSS every second; every request of :mod:`benchmarks.reliability.hostile` before and
  after (default limits): no 5xx, every 4xx a JSON body.
- ``upstream``: a pool over two stub replicas under load; one killed, then replaced by a slow one.
- ``failover``: a fallback chain's primary killed then restarted under load
  (:mod:`benchmarks.reliability.failover`).
- ``redis``: per-key limits in Redis; Redis killed under load, ``redis_failure`` closed and open.
- ``sigterm``: SIGTERM with requests in flight: every one answered, then the process exits.
- ``engine``: the vLLM engine on CPU (tiny Qwen3) killed under load: one response per request,
  503 + Retry-After meanwhile; recovery time. Holds ``/tmp/vllm.lock``.

"Recovery": from the fault's end to the first 200. Every request is counted; one without a
response is "lost". The ``fuzz`` section (``fuzz_memory.py``) was removed on 2026-12-05,
answered in reliability 2026-12-01.
"""
