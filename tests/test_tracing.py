"""OpenTelemetry traces from a real gateway process to a real OTLP/HTTP receiver on loopback.

The gateway runs with nothing but the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` and a
short ``OTEL_BSP_SCHEDULE_DELAY``); the receiver decodes the SDK's real protobuf exports. Checked:
the span tree of a request (parented by the client's ``traceparent``, children in order, the
attributes), an error (an upstream answering 500), a cancelled request (the client leaves), that a
pool replica receives the trace context naming the gateway's call span, and that no span carries
a key or a document's text. Without the variables nothing of OpenTelemetry is even imported.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import httpx
import pytest

from gateway.security.auth import generate_key, hash_key
from tests.conftest import ROOT, ServerProcess
from tests.fake_dashscope import FakeDashScope
from tests.loopback import LoopbackServer
from tests.otlp_receiver import OtlpReceiver, Span

pytestmark = pytest.mark.slow

KEY = generate_key()
SECRET_DOC = "confidential-" + secrets.token_hex(8)  # a document's text: must never be in a span


class Upstream(BaseHTTPRequestHandler):
    """A Cohere-protocol replica: scores 1/(i+1); the model "broken" gets 500. Keeps traceparents."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        self._answer(200, b"{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Upstream.seen.append({k.lower(): v for k, v in self.headers.items()})
        if body.get("model") == "broken":
            self._answer(500, b'{"message": "boom"}')
            return
        results = [{"index": i, "relevance_score": 1 / (i + 1)} for i in range(len(body["documents"]))]
        self._answer(
            200, json.dumps({"id": "u", "results": results, "meta": {"billed_units": {"search_units": 1}}}).encode()
        )

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, OtlpReceiver]]:
    receiver = OtlpReceiver()
    upstream = LoopbackServer(Upstream)
    dashscope = FakeDashScope(api_key="sk-ds-test").__enter__()
    from tests.tiny_encoders import build_tiny_cross_encoder

    checkpoint = build_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "ce", seed=0)
    config = (
        f'[[auth.keys]]\nid = "team"\nhash = "{hash_key(KEY)}"\nmodels = ["*"]\n'
        '[[models]]\nname = "m"\nengine = "static"\n'
        '[[models]]\nname = "slow"\nengine = "static"\ndelay_s = 30.0\n'
        f'[[models]]\nname = "pool"\nengine = "pool"\nprotocol = "cohere"\nurls = ["{upstream.url}"]\nmodel = "ok"\n'
        f'[[models]]\nname = "broken"\nengine = "pool"\nprotocol = "cohere"\nurls = ["{upstream.url}"]\n'
        'model = "broken"\n'
        # A chain whose first target fails (its replica answers 500) and whose second serves.
        '[[models]]\nname = "chain"\nengine = "chain"\ntargets = ["broken", "m"]\naccepts = "other-models"\n'
        f'[[models]]\nname = "ds"\nengine = "dashscope"\nmodel = "gte-rerank-v2"\nbase_url = "{dashscope.url}"\n'
        'api_key_env = "DS_TEST_KEY"\n'
        # A real tokenizer and forward pass: the tokenize span and the engine's own steps.
        f'[[models]]\nname = "ce"\nengine = "transformers"\npath = "{checkpoint}"\ndevice = "cpu"\n'
        'dtype = "float32"\n'
    )
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "gw-test",
        "DS_TEST_KEY": "sk-ds-test",
    }
    server = ServerProcess(config, tmp_path_factory.mktemp("traced"), env=env)
    try:
        server.wait_ready()
        yield server, receiver, dashscope
    finally:
        server.stop()
        upstream.close()
        dashscope.__exit__(None, None, None)
        receiver.close()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _post(server: ServerProcess, model: str, traceparent: str, **kw: Any) -> httpx.Response:
    body = {"model": model, "query": "q", "documents": ["alpha beta", SECRET_DOC]}
    # baggage is the client's own (user ids, tenant names...): it stays at the gateway
    headers = {
        "Authorization": f"Bearer {KEY}",
        "traceparent": traceparent,
        "tracestate": "vendor=x",
        "baggage": "user.email=someone%40example.com",
    }
    return httpx.post(f"{server.url}/v2/rerank", json=body, headers=headers, **kw)


def _names(span: Span) -> list[str]:
    return [c.name for c in span.children]


def _all(span: Span) -> Iterator[Span]:
    yield span
    for child in span.children:
        yield from _all(child)


def _contained(span: Span) -> None:
    """Every child starts after its parent and ends before it, in the order they ran."""
    for child in span.children:
        assert span.start_ns <= child.start_ns <= child.end_ns <= span.end_ns, (span.name, child.name)
        _contained(child)
    starts = [c.start_ns for c in span.children]
    assert starts == sorted(starts)


def test_a_request_trace_has_its_spans_in_order_with_attributes(traced) -> None:
    server, receiver, _ = traced
    traceparent, trace_id, parent = _traceparent()
    assert _post(server, "m", traceparent).status_code == 200
    root = receiver.trace(trace_id, "POST /v2/rerank")
    assert root.parent_id == parent and root.kind == 2 and root.service == "gw-test"  # SERVER, under the client's span
    attrs = root.attributes
    assert attrs["http.response.status_code"] == 200 and attrs["rerank.outcome"] == "ok"
    assert attrs["rerank.model"] == "m" and attrs["rerank.documents"] == 2 and attrs["rerank.tokens"] == 5
    assert attrs["rerank.search_units"] == 1
    assert _names(root) == ["auth", "engine"]
    engine = root.children[1]
    assert engine.attributes["rerank.items"] == 2 and engine.attributes["rerank.tokens"] == 5
    assert engine.attributes["rerank.engine"] == "static" and engine.attributes["rerank.outcome"] == "ok"
    assert _names(engine) == ["engine.step"] and engine.children[0].attributes["rerank.step.rows"] == 2
    _contained(root)


def test_a_tokenizing_engine_adds_the_tokenize_span_and_its_steps(traced) -> None:
    server, receiver, _ = traced
    traceparent, trace_id, _ = _traceparent()
    assert _post(server, "ce", traceparent).status_code == 200
    root = receiver.trace(trace_id, "POST /v2/rerank")
    assert _names(root) == ["auth", "tokenize", "engine"]
    engine = root.children[2]
    assert engine.attributes["rerank.engine"] == "transformers" and engine.attributes["rerank.items"] == 2
    assert engine.attributes["rerank.tokens"] == root.attributes["rerank.tokens"] > 0
    steps = [c for c in engine.children if c.name == "engine.step"]
    assert sum(s.attributes["rerank.step.rows"] for s in steps) == 2
    _contained(root)


def test_an_upstream_receives_the_trace_context_of_the_gateways_call(traced) -> None:
    server, receiver, _ = traced
    traceparent, trace_id, _ = _traceparent()
    Upstream.seen.clear()
    assert _post(server, "pool", traceparent).status_code == 200
    root = receiver.trace(trace_id, "POST /v2/rerank")
    call = next(s for s in _all(root) if s.name == "upstream.call")
    assert call.kind == 3 and call.attributes["rerank.target"].startswith("http://127.0.0.1:")  # CLIENT
    assert call.attributes["http.response.status_code"] == 200 and call.attributes["rerank.outcome"] == "ok"
    sent = [h for h in Upstream.seen if "traceparent" in h]
    assert sent and sent[-1]["traceparent"] == f"00-{trace_id}-{call.span_id}-01"
    assert sent[-1]["tracestate"] == "vendor=x"
    assert "baggage" not in sent[-1]  # the client's baggage never leaves the gateway
    _contained(root)


def test_dashscope_receives_the_trace_context_too(traced) -> None:
    server, receiver, dashscope = traced
    traceparent, trace_id, _ = _traceparent()
    assert _post(server, "ds", traceparent).status_code == 200
    root = receiver.trace(trace_id, "POST /v2/rerank")
    call = next(s for s in _all(root) if s.name == "upstream.call")
    assert call.kind == 3 and call.attributes["rerank.outcome"] == "ok"
    assert dashscope.requests[-1].headers["traceparent"] == f"00-{trace_id}-{call.span_id}-01"
    assert "baggage" not in dashscope.requests[-1].headers
    assert "sk-ds-test" not in str(call.attributes)
    _contained(root)


def test_an_error_trace_marks_the_failed_call_the_engine_and_the_request(traced) -> None:
    server, receiver, _ = traced
    traceparent, trace_id, _ = _traceparent()
    assert _post(server, "broken", traceparent).status_code == 502
    root = receiver.trace(trace_id, "POST /v2/rerank")
    assert root.status_code == 2 and root.attributes["rerank.outcome"] == "error"
    assert root.attributes["http.response.status_code"] == 502
    engine = next(s for s in root.children if s.name == "engine")
    assert engine.status_code == 2 and engine.attributes["rerank.outcome"] != "ok"
    call = next(s for s in engine.children if s.name == "upstream.call")
    assert call.status_code == 2 and call.attributes["http.response.status_code"] == 500
    _contained(root)


def test_a_chain_has_one_span_per_attempt_with_its_target_and_outcome(traced) -> None:
    server, receiver, _ = traced
    traceparent, trace_id, _ = _traceparent()
    answer = _post(server, "chain", traceparent)
    assert answer.status_code == 200, server.output()[-6000:]
    root = receiver.trace(trace_id, "POST /v2/rerank")
    attempts = [s for s in root.children if s.name == "route.attempt"]
    assert [(a.attributes["rerank.target"], a.attributes["rerank.chain"]) for a in attempts] == [
        ("broken", "chain"),
        ("m", "chain"),
    ]
    assert attempts[0].attributes["rerank.outcome"] != "served" and attempts[1].attributes["rerank.outcome"] == "served"
    assert [c.name for c in attempts[0].children] == ["engine"]  # the failed call to the replica under it
    assert any(s.name == "upstream.call" for s in _all(attempts[0]))
    _contained(root)


def test_a_cancelled_request_ends_its_spans_as_cancelled(traced) -> None:
    server, receiver, _ = traced
    traceparent, trace_id, _ = _traceparent()
    with pytest.raises(httpx.ReadTimeout):  # the client leaves while the engine works (30 s)
        _post(server, "slow", traceparent, timeout=httpx.Timeout(10, read=0.5))
    root = receiver.trace(trace_id, "POST /v2/rerank")
    assert root.attributes["http.response.status_code"] == 499 and root.attributes["rerank.outcome"] == "cancelled"
    engine = next(s for s in root.children if s.name == "engine")
    assert engine.attributes["rerank.outcome"] == "cancelled"
    assert root.end_ns - root.start_ns < 25e9  # the engine's 30 s were not waited for
    _contained(root)


def test_no_span_holds_a_key_or_a_document(traced) -> None:
    server, receiver, _ = traced
    _post(server, "m", _traceparent()[0])
    exported = b"".join(receiver.bodies)
    assert exported  # the earlier tests' spans are all in there
    for secret in (KEY, hash_key(KEY)[7:], SECRET_DOC, "alpha beta"):
        assert secret.encode() not in exported
    logged = server.output()
    assert "tracing_on" in logged
    for secret in (KEY, hash_key(KEY)[7:], SECRET_DOC):
        assert secret not in logged


def test_without_otel_variables_nothing_of_opentelemetry_is_imported() -> None:
    code = (
        "import sys; from gateway.app import create_app; from schemas.config import Settings, StaticEngineConfig\n"
        "create_app(Settings(models=(StaticEngineConfig(name='m'),)), configure_logs=False)\n"
        "from gateway.observability import tracing\n"
        "ours = ('opentelemetry.sdk', 'opentelemetry.trace', 'opentelemetry.exporter', 'opentelemetry.propagate')\n"
        "print(tracing.TRACER is None, sorted(m for m in sys.modules if m.startswith(ours)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    # (Another library may import opentelemetry.semconv's constants: no SDK, API or exporter.)
    assert out.stdout.strip() == "True []", out.stdout + out.stderr
