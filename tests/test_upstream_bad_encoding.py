"""An upstream answer that cannot be decoded (a corrupt gzip body) is the upstream's failure: a
502-class :class:`EngineError` (so a fallback chain moves on), never a bare httpx exception (a 500)."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from adapters.base import EngineError
from adapters.upstreams.http import make_client, post_bounded


class _CorruptGzip(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # the http.server handler name
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b"this is not gzip at all"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # the base class's name
        pass


def test_a_body_that_does_not_decode_is_an_engine_error() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CorruptGzip)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    async def call() -> None:
        client = make_client(
            base_url=f"http://127.0.0.1:{server.server_address[1]}",
            connect_timeout_s=2.0,
            read_timeout_s=2.0,
            max_connections=2,
        )
        try:
            await post_bounded(client, "/rerank", b"{}", upstream="upstream", read_timeout_s=2.0)
        finally:
            await client.aclose()

    try:
        with pytest.raises(EngineError, match="could not be read"):
            asyncio.run(call())
    finally:
        server.shutdown()
        server.server_close()
