"""A request still running when the graceful-shutdown time is over is cancelled by the server.
Its client is still there: it gets a 503 with the Cohere body (the SDKs retry it, elsewhere),
and the access line and /metrics say 503 (the line with ``cancelled = "shutdown"``), not a
500 (a gateway bug) nor a 499 (a client that left)."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

CONFIG = (
    '[logging]\nformat = "json"\n[server]\nrunner = "{runner}"\nshutdown_timeout_s = 1\n'
    '[[models]]\nname = "stuck"\nengine = "static"\ndelay_s = 60.0\ntimeout_s = 120\n'
)


# granian: the gateway's own timer cancels the request (gateway.launch.servers.SigtermDrain).
@pytest.mark.parametrize("runner", ["uvicorn", "granian"])
def test_a_request_cancelled_at_shutdown_is_answered_logged_and_counted_503(gateway_server, tmp_path, runner) -> None:
    # The counters outlive the process in prometheus-client's multiprocess files.
    server = gateway_server(CONFIG.format(runner=runner), env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    result: dict[str, httpx.Response | Exception] = {}

    def call() -> None:
        try:
            result["r"] = httpx.post(
                f"{server.url}/v1/rerank",
                json={"query": "q", "documents": ["d"]},
                headers={"x-request-id": "stuck-1"},
                timeout=30,
            )
        except httpx.HTTPError as exc:
            result["r"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/ready", timeout=5).json()["models"][0]["in_flight"] != 1:
        assert time.monotonic() < deadline, "the request never got in flight"
        time.sleep(0.1)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    thread.join(timeout=30)

    resp = result["r"]
    assert isinstance(resp, httpx.Response), resp
    assert resp.status_code == 503 and resp.headers["retry-after"], resp.text
    assert "shutting down" in resp.json()["message"] and resp.json()["id"] == "stuck-1"
    lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    (access,) = [x for x in lines if x.get("request_id") == "stuck-1" and x["event"] == "request"]
    assert access["status"] == 503 and access["cancelled"] == "shutdown", access
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    counted = {
        s.labels["status"]: s.value
        for m in registry.collect()
        if m.name == "rerank_requests"
        for s in m.samples
        if s.name == "rerank_requests_total" and s.labels["model"] == "stuck"
    }
    assert counted == {"503": 1.0}, counted
