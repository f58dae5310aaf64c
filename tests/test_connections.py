"""Connections against a real server process over raw sockets (issue #12, items 2 and 5).

Idle, slow-loris and half-sent connections are closed within the configured bounds; a client
that hangs up mid-body, or sends broken chunked framing, is logged and counted as 499 (or
answered 400 by the HTTP parser), never as a 5xx. Both ASGI servers, small bounds.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.slow

KEEP_ALIVE_S = 1.0
HEADER_S = 1.0
BODY_S = 1.5
SLACK_S = 2.5  # scheduling on a loaded 2-core machine

CONFIG = f"""
[server]
runner = "{{runner}}"
keep_alive_timeout_s = {KEEP_ALIVE_S}
header_read_timeout_s = {HEADER_S}
body_read_timeout_s = {BODY_S}

[logging]
format = "json"

[[models]]
name = "static"
engine = "static"
"""


@pytest.fixture(scope="module", params=["uvicorn", "granian"])
def server(request, tmp_path_factory) -> Iterator[ServerProcess]:
    srv = ServerProcess(CONFIG.format(runner=request.param), tmp_path_factory.mktemp(request.param))
    try:
        srv.wait_ready(timeout=60)
        yield srv
    finally:
        srv.stop()


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.settimeout(10)
    return sock


def _closed_within(sock: socket.socket, bound: float) -> tuple[float, bytes]:
    """Read until the server closes; return (seconds it took, bytes received)."""
    start = time.monotonic()
    data = b""
    sock.settimeout(bound + SLACK_S)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"connection still open after {bound + SLACK_S:.1f} s; received {data[:200]!r}")
    return time.monotonic() - start, data


def _statuses(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'rerank_requests_total\{.*status="(\d+)"\} ([0-9.e+]+)', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def _log_statuses(server: ServerProcess) -> list[int]:
    statuses = []
    for line in server.output().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "request" and record.get("route", "").endswith("rerank"):
                statuses.append(record["status"])
    return statuses


def _healthy(server: ServerProcess) -> None:
    resp = httpx.post(f"{server.url}/v2/rerank", json={"model": "static", "query": "q", "documents": ["a"]}, timeout=10)
    assert resp.status_code == 200, resp.text


def test_fresh_idle_connection_is_closed(server):
    if "granian" in server.config.read_text():
        # hyper starts its header timer at the first byte: documented in docs/configuration.md (granian note).
        pytest.skip("granian does not close a connection that never sends a byte")
    sock = _connect(server)
    took, data = _closed_within(sock, KEEP_ALIVE_S)
    assert data == b"" and took >= KEEP_ALIVE_S * 0.5


def test_idle_keep_alive_connection_is_closed_after_a_response(server):
    sock = _connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    _closed_within(sock, KEEP_ALIVE_S)


def test_slow_loris_headers_are_cut_off(server):
    sock = _connect(server)
    sock.sendall(b"POST /v2/rerank HTTP/1.1\r\nHost: t\r\n")
    start = time.monotonic()
    try:
        # One header line every 0.3 s, forever: only the header deadline can stop this.
        while time.monotonic() - start < HEADER_S + SLACK_S:
            sock.sendall(b"X-Slow: 1\r\n")
            time.sleep(0.3)
    except (BrokenPipeError, ConnectionResetError):
        pass
    else:
        _closed_within(sock, 0.5)
    assert time.monotonic() - start < HEADER_S + SLACK_S + 1
    _healthy(server)


def test_half_sent_body_gets_408_and_is_closed(server):
    sock = _connect(server)
    sock.sendall(
        b"POST /v2/rerank HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        b'{"model":"static",'
    )
    took, data = _closed_within(sock, BODY_S)
    assert took < BODY_S + SLACK_S
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data[:300]
    assert b"x-request-id" in head.lower()
    error = json.loads(body.split(b"\r\n")[1] if b"chunked" in head.lower() else body)
    assert set(error) == {"message", "id", "detail"} and "did not arrive" in error["message"]
    _healthy(server)


def test_disconnect_mid_body_is_499_not_500(server):
    before = _statuses(server)
    sock = _connect(server)
    sock.sendall(
        b"POST /v2/rerank HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
        b'{"model":"static","query":"q","documents":["'
    )
    time.sleep(0.3)
    sock.close()
    deadline = time.monotonic() + 10
    while _statuses(server).get("499", 0) <= before.get("499", 0):
        assert time.monotonic() < deadline, f"no 499 counted: {_statuses(server)}"
        time.sleep(0.1)
    after = _statuses(server)
    assert after.get("500", 0) == before.get("500", 0), after
    assert 499 in _log_statuses(server) and 500 not in _log_statuses(server)
    assert "Traceback" not in server.output()
    _healthy(server)


def test_broken_chunked_framing_is_not_a_5xx(server):
    before = _statuses(server)
    sock = _connect(server)
    sock.sendall(
        b"POST /v2/rerank HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"mod\r\nZZZ-not-hex\r\n'
    )
    _, data = _closed_within(sock, BODY_S)
    if data:
        status = int(data.split(b" ", 2)[1])
        assert 400 <= status < 500, data[:300]
    time.sleep(0.3)
    after = _statuses(server)
    assert not any(code.startswith("5") and after[code] > before.get(code, 0) for code in after), after
    assert not any(s >= 500 for s in _log_statuses(server))
    _healthy(server)
