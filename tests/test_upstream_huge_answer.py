"""An upstream answer far larger than any answer to the request is refused, not read into memory.

The pool read a replica's whole body (``response.read()``) and DashScope's client the whole
answer, however large: a replica stuck streaming (a proxy's runaway page, a broken server) or a
valid answer padded to gigabytes was held in memory until ``timeout_s``. The answer to ``n``
texts is bounded by the request (vLLM echoes the documents): a body past 16 MiB + 4 x the
request body is a 502, and the connection is dropped after reading at most that much.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import DashScopeEngineConfig, PoolEngineConfig, Settings
from tests.loopback import LoopbackServer

PAD = 256 * 1024 * 1024  # whitespace before a valid answer: valid JSON, absurdly large


class PaddedUpstream(LoopbackServer):
    """Answers every rerank call validly, after ``PAD`` bytes of JSON whitespace; counts bytes sent."""

    def __init__(self) -> None:
        self.sent = 0
        self.hung_up = False  # the gateway closed the connection before the body was sent
        self.ended = threading.Event()  # the handler is done sending, either way
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._head(200, 2)
                self.wfile.write(b"{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                docs = body["input"]["documents"] if "input" in body else body["documents"]
                res = [{"index": i, "relevance_score": 0.5} for i in range(len(docs))]
                answer = {"output": {"results": res}} if "input" in body else {"results": res}
                tail = json.dumps(answer).encode()
                self._head(200, PAD + len(tail))
                chunk = b" " * (1 << 20)
                try:
                    for _ in range(PAD // len(chunk)):
                        self.wfile.write(chunk)
                        up.sent += len(chunk)
                    self.wfile.write(tail)
                    self.wfile.flush()
                except OSError:  # the gateway hung up: what we wanted
                    up.hung_up = True
                finally:
                    up.ended.set()

            def _head(self, status: int, length: int) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(length))
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)


@pytest.fixture
def upstream():
    up = PaddedUpstream()
    yield up
    up.close()


@pytest.mark.parametrize("model", ["pool", "dashscope"])
def test_an_answer_far_larger_than_the_request_is_a_502(upstream, model):
    models = (
        PoolEngineConfig(name="pool", protocol="vllm", urls=(upstream.url,)),
        DashScopeEngineConfig(name="dashscope", model="gte-rerank-v2", base_url=upstream.url, api_key="k", retries=0),
    )
    with TestClient(create_app(Settings(models=models), configure_logs=False)) as c:
        r = c.post("/v2/rerank", json={"model": model, "query": "q", "documents": ["alpha", "beta"]})
        assert r.status_code == 502, r.text[:300]
        assert set(r.json()) == {"message", "id", "detail"}
        # Events, not a wall-clock bound: the upstream's handler ended because the gateway hung
        # up on it (not by sending the whole body), having sent far less than the padding.
        assert upstream.ended.wait(60), "the upstream was still sending a minute after the 502"
        assert upstream.hung_up, f"the gateway read the whole {upstream.sent / 2**20:.0f} MiB"
        assert upstream.sent < 64 * 1024 * 1024  # stopped reading early, not after the whole body
