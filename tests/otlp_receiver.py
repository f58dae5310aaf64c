"""A real OTLP/HTTP trace receiver on loopback: POST /v1/traces decoded with the OpenTelemetry
protobuf messages (``opentelemetry-proto``), the spans kept for the test to look at.

No Collector or Jaeger server ships through the registries reachable here (PyPI's ``jaeger*``
packages are clients; the Collector and Jaeger are Go programs), so the tests receive what the
SDK's real OTLP exporter sends, the way a Collector would: protobuf ``ExportTraceServiceRequest``
bodies, gzip when so encoded.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.loopback import LoopbackServer


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    service: str
    children: list[Span] = field(default_factory=list)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.bodies: list[bytes] = []  # raw, for the no-secrets grep
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                request = ExportTraceServiceRequest.FromString(raw)
                spans = []
                for resource_spans in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        for s in scope_spans.spans:
                            spans.append(
                                Span(
                                    name=s.name,
                                    trace_id=s.trace_id.hex(),
                                    span_id=s.span_id.hex(),
                                    parent_id=s.parent_span_id.hex(),
                                    kind=s.kind,
                                    start_ns=s.start_time_unix_nano,
                                    end_ns=s.end_time_unix_nano,
                                    attributes={a.key: _value(a.value) for a in s.attributes},
                                    status_code=s.status.code,
                                    service=str(resource.get("service.name")),
                                )
                            )
                with lock:
                    receiver.bodies.append(raw)
                    receiver.spans.extend(spans)
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = LoopbackServer(Handler)
        self.url = self._server.url

    def trace(self, trace_id: str, root: str, timeout: float = 15.0) -> Span:
        """The span tree of ``trace_id`` once its root span named ``root`` (and its children) arrived."""
        deadline = time.monotonic() + timeout
        while True:
            spans = [s for s in list(self.spans) if s.trace_id == trace_id]
            roots = [s for s in spans if s.name == root]
            if roots:
                by_id = {s.span_id: s for s in spans}
                for s in spans:
                    s.children = []
                for s in sorted(spans, key=lambda s: s.start_ns):
                    if s.parent_id in by_id:
                        by_id[s.parent_id].children.append(s)
                return roots[0]
            assert time.monotonic() < deadline, f"no span {root!r} of trace {trace_id} arrived"
            time.sleep(0.05)

    def close(self) -> None:
        self._server.close()
