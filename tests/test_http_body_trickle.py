"""A request answered without reading its body (404, 405, 401, 413 by Content-Length) must not
let its client hold the connection forever by trickling the body: every byte reset uvicorn's
keep-alive timer and the app's body timeout only runs while the app reads. The connection is
closed once server.body_read_timeout_s has passed since the headers. granian (hyper) needs no
help: it closes a connection whose request body is unread as soon as the answer is sent."""

from __future__ import annotations

import socket
import time

import pytest

CONFIG = """
[server]
body_read_timeout_s = 1.0
keep_alive_timeout_s = 2.0
[limits]
max_body_bytes = 2000
[[models]]
engine = "static"
name = "static"
"""


def _held_s(port: int, path: str, limit_s: float = 8.0) -> float:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(0.3)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{{".encode())
    start = time.monotonic()
    try:
        while time.monotonic() - start < limit_s:
            try:
                if sock.recv(65536) == b"":
                    return time.monotonic() - start
            except TimeoutError:
                pass
            except OSError:
                return time.monotonic() - start
            try:
                sock.sendall(b" ")
            except OSError:
                return time.monotonic() - start
            time.sleep(0.2)
        return limit_s
    finally:
        sock.close()


@pytest.mark.parametrize("runner", ["uvicorn", "granian"])
@pytest.mark.parametrize("path", ["/nope", "/v1/rerank"])  # 404, and 413 from Content-Length
def test_trickled_body_of_an_answered_request_is_cut(gateway_server, path, runner) -> None:
    if runner == "granian":
        pytest.importorskip("granian")
    server = gateway_server(CONFIG.replace("[server]", f'[server]\nrunner = "{runner}"'))
    held = _held_s(server.port, path)
    assert held < 5.0, f"{path}: connection held {held:.1f}s by a trickled body"
    # A body that arrives in time is still served, on a kept-alive connection.
    import httpx

    with httpx.Client(base_url=server.url) as client:
        for _ in range(2):
            assert client.post("/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 200
