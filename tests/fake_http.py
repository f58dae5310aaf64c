"""What the fake upstreams of the tests share (tests/fake_bedrock.py, tests/fake_dashscope.py,
tests/fake_providers.py, and the replicas of tests/test_pool.py and tests/test_upstream_usage.py):
the real HTTP server on loopback, the requests it received and the faults a test scripts for the
next ones. Each fake keeps only its protocol, in ``handle`` (and ``handle_get`` for health probes).
"""

from __future__ import annotations

import abc
import threading
from collections import deque
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any, Generic, Self, TypeVar

from tests.loopback import LoopbackServer

Answer = tuple[int, dict[str, str], bytes]  # status, headers besides Content-Type and -Length, JSON body
F = TypeVar("F")


class FakeUpstream(abc.ABC, Generic[F]):
    """A fake upstream on 127.0.0.1 and a free port: ``with fake: fake.url`` -- closed when the block ends.

    A real HTTP/1.1 server (standard library, keep-alive like the real services, a thread per
    connection): every ``POST`` goes to ``handle(path, headers, raw)``, header names lowercased, every
    ``GET`` to ``handle_get(path)`` (404 unless a fake answers probes), and the ``Answer`` is sent as
    JSON; a client that hung up before it is ignored. The fake records what it received in ``received`` (its own list,
    under its own name) and keeps a queue of scripted faults per ``queues`` name ("" for one).
    """

    def __init__(self, received: list[Any], queues: Iterable[str] = ("",)) -> None:
        self._received = received
        self._faults: dict[str, deque[F]] = {name: deque() for name in queues}
        self._lock = threading.Lock()
        self._stop = threading.Event()  # ends a held answer when the server closes
        self._server = LoopbackServer(_handler(self))

    @property
    def url(self) -> str:
        return self._server.url

    @abc.abstractmethod
    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        """The answer to a POST: the fake's protocol."""

    def handle_get(self, path: str) -> Answer:
        """The answer to a GET (a pool's health probe); the hosted APIs have none."""
        return 404, {}, b'{"message":"not found"}'

    def pending(self) -> int:
        """How many scripted faults no request has taken yet."""
        with self._lock:
            return sum(len(q) for q in self._faults.values())

    def clear(self) -> None:
        """Forget the requests received and the faults not yet taken."""
        with self._lock:
            self._received.clear()
            for q in self._faults.values():
                q.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._server.close()

    def _script(self, queue: str, faults: Iterable[F]) -> None:
        """Answer the next requests of ``queue`` with these faults, in order."""
        with self._lock:
            self._faults[queue].extend(faults)

    def _arrived(self, record: Any, queue: str = "") -> F | None:
        """Record a request; the fault scripted for it, if any."""
        with self._lock:
            self._received.append(record)
            return self._faults[queue].popleft() if self._faults[queue] else None

    def _held(self, seconds: float) -> bool:
        """Hold the answer ``seconds``; True when the server closed meanwhile (nobody waits for it)."""
        return self._stop.wait(seconds)


def _handler(fake: FakeUpstream[Any]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the real services

        def do_GET(self) -> None:
            self._answer(*fake.handle_get(self.path))

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            self._answer(*fake.handle(self.path, headers, raw))

        def _answer(self, status: int, extra: dict[str, str], payload: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                pass

        def log_message(self, *args: object) -> None:
            pass

    return Handler
