"""SIGTERM under granian: a request still running at ``server.shutdown_timeout_s`` is answered
503 and logged, and the engines are stopped (``gateway_stopping``/``gateway_stopped``) before
the worker ends, as under uvicorn (tests/test_shutdown_cancel_status.py,
tests/test_operating.py). granian's own shutdown waits for every in-flight request and kills the
worker process when its kill timeout is over: without the gateway's own timer the stuck request
held the worker until it was killed, with no answer, no request line and no engine stop.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from gateway.launch.servers import _GRANIAN_STOP_MARGIN_S

pytestmark = pytest.mark.slow

CONFIG = (
    '[logging]\nformat = "json"\n[server]\nrunner = "granian"\nshutdown_timeout_s = 2\n'
    '[[models]]\nname = "stuck"\nengine = "static"\ndelay_s = 60.0\ntimeout_s = 120\n'
    '[[models]]\nname = "slow"\nengine = "static"\ndelay_s = 1.0\n'
)
# run_granian's workers_kill_timeout for the shutdown_timeout_s = 2 above.
KILL_TIMEOUT_S = 2 + _GRANIAN_STOP_MARGIN_S


def test_sigterm_answers_the_stuck_request_503_and_stops_the_engines(gateway_server) -> None:
    server = gateway_server(CONFIG)
    results: dict[str, httpx.Response | Exception] = {}

    def call(model: str) -> None:
        try:
            results[model] = httpx.post(
                f"{server.url}/v1/rerank",
                json={"model": model, "query": "q", "documents": ["d"]},
                headers={"x-request-id": f"{model}-1"},
                timeout=30,
            )
        except httpx.HTTPError as exc:
            results[model] = exc

    threads = [threading.Thread(target=call, args=(m,)) for m in ("stuck", "slow")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not all(m["in_flight"] == 1 for m in httpx.get(f"{server.url}/ready", timeout=5).json()["models"]):
        assert time.monotonic() < deadline, "the requests never got in flight"
        time.sleep(0.05)
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    took = time.monotonic() - sent
    for t in threads:
        t.join(timeout=30)

    slow, stuck = results["slow"], results["stuck"]
    assert isinstance(slow, httpx.Response) and slow.status_code == 200  # drained
    assert isinstance(stuck, httpx.Response), stuck
    assert stuck.status_code == 503 and stuck.headers["retry-after"], stuck.text
    assert "shutting down" in stuck.json()["message"] and stuck.json()["id"] == "stuck-1"
    # Waited shutdown_timeout_s (2 s) for the stuck one (a lower bound: load only lengthens it);
    # not its 60 s: the events above say the shutdown cancelled it (503, cancelled "shutdown"),
    # and the process exited within wait()'s 30 s, half the stuck request's sleep.
    assert took > 1.8, took
    output = server.output()
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    (access,) = [x for x in lines if x.get("request_id") == "stuck-1" and x["event"] == "request"]
    assert access["status"] == 503 and access["cancelled"] == "shutdown", access
    events = [x["event"] for x in lines]
    assert events.index("gateway_draining") < events.index("gateway_stopping") < events.index("gateway_stopped")
    (draining,) = [x for x in lines if x["event"] == "gateway_draining"]
    assert draining["signal"] == "SIGTERM" and draining["in_flight_requests"] == 2, draining
    # Not granian's last-resort kill: it comes only once join(workers_kill_timeout) has timed
    # out, so a worker that refused to stop kept the process alive at least KILL_TIMEOUT_S.
    # granian's "Killing worker-1 after it refused to gracefully stop" line is no proof of one:
    # granian 2.8.9 also writes it for a worker that has already exited. Its watcher thread's
    # waitpid() can reap the worker first; the stopping thread's waitpid() then fails (ECHILD),
    # which multiprocessing's is_alive() reads as alive until the watcher thread gets the GIL
    # back, and granian waits 1 ms for that. Under load it does not always: the line came
    # 6-30 ms after gateway_stopped, 2 s after SIGTERM, in one full .ci/run and in 2 of 60 runs
    # of this test beside 4 busy loops on the 2-core box.
    assert took < KILL_TIMEOUT_S, (took, output)
    assert "Traceback" not in output, output
