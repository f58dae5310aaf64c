"""A Cohere-protocol rerank upstream (``POST /v2/rerank``, ``GET /health``) whose behaviour tests switch.

Every document gets the same score (``score``), so an answer says which server computed it.
``mode`` breaks it on purpose: ``ok``, ``slow`` (sleeps ``delay_s`` first), ``hold`` (waits until
``release`` is set), ``500`` / ``502`` / ``503`` / ``429`` (answers that status), ``400`` (refuses
the input, as a real server refuses a bad request).

Two ways to run it: in the test's process (:class:`CohereUpstream`, a loopback thread), or as a
process of its own (``python -m tests.fake_cohere_upstream --port P --score S``; ``POST /control``
with ``{"mode": ..., "delay_s": ...}`` switches it), so a test can kill and restart it.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.loopback import LoopbackServer

__all__ = ("CohereUpstream", "make_handler")


class _State:
    def __init__(self, score: float) -> None:
        self.score = score
        self.mode = "ok"
        self.delay_s = 2.0
        self.calls = 0
        self.arrived = threading.Event()  # set when a request reaches a "hold"
        self.release = threading.Event()


def make_handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet: the test's output is the gateway's
            pass

        def do_GET(self) -> None:
            self._send(200 if state.mode != "down" else 503, {"status": "ok"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
            if self.path == "/control":
                state.mode = body.get("mode", state.mode)
                state.delay_s = float(body.get("delay_s", state.delay_s))
                self._send(200, {"mode": state.mode})
                return
            state.calls += 1
            mode = state.mode
            if mode == "slow":
                time.sleep(state.delay_s)
            elif mode == "hold":
                state.arrived.set()
                state.release.wait(30)
            elif mode.isdigit():
                status = int(mode)
                headers = {"Retry-After": "1"} if status in (429, 503) else {}
                self._send(status, {"message": f"fake upstream answers {status}"}, headers)
                return
            docs = body["documents"]
            results = [{"index": i, "relevance_score": state.score} for i in range(len(docs))]
            self._send(200, {"id": "fake", "results": results, "meta": {"billed_units": {"search_units": 1}}})

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


class CohereUpstream(LoopbackServer):
    """The fake in this process: ``mode``, ``delay_s``, ``calls``, ``arrived`` / ``release`` for ``hold``."""

    def __init__(self, score: float) -> None:
        self.state = _State(score)
        super().__init__(make_handler(self.state))

    @property
    def calls(self) -> int:
        return self.state.calls

    def set(self, mode: str, delay_s: float | None = None) -> None:
        self.state.mode = mode
        if delay_s is not None:
            self.state.delay_s = delay_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--score", type=float, required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(_State(args.score)))
    server.daemon_threads = True
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
