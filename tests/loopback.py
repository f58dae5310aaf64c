"""A threaded HTTP server on a loopback port, for the fake upstreams the tests write."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    """``handler`` served on 127.0.0.1 (a free port) from a daemon thread; ``url``; ``close()``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_loaded(client, timeout: float = 30.0) -> None:
    """Poll a gateway TestClient's ``/ready`` until no model is still loading (bounded)."""
    import time

    deadline = time.monotonic() + timeout
    while any(m["state"] == "loading" for m in client.get("/ready").json()["models"]):
        assert time.monotonic() < deadline, "a model was still loading"
        time.sleep(0.05)
