"""The passthrough path: top_n forwarded upstream, upstream answers decoded, several workers.

- A ranking upstream written here from the Cohere / vLLM / Infinity bodies (it honours
  ``top_n`` and records what it was sent) behind the gateway's pool engine: forwarding
  ``top_n`` gives the same results as scoring everything, checked against an independent
  ranking of the fake model's scores; duplicates and split calls still ask for every score.
- Malformed answers (not JSON, wrong shapes, wrong counts, repeated indices) are 502s.
- A real ``rerank-gateway serve`` with ``server.workers = 2``: both workers serve on one port
  and any worker's ``/metrics`` sums the counters of both (prometheus multiprocess mode).
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import PoolEngineConfig, Settings
from tests.fake_dashscope import fake_score
from tests.loopback import LoopbackServer

Q = "which document talks about rivers?"
DOCS = [
    f"document {i} about {w}"
    for i, w in enumerate(["rivers", "water", "lakes", "cities", "mountains", "roads", "sea", "sand"])
]


class RankingUpstream(LoopbackServer):
    """A ``/rerank`` and ``/v2/rerank`` server that ranks with ``fake_score`` and honours top_n.

    ``mode`` breaks its answers on purpose: ``"ok"``, or one of the malformed kinds below.
    """

    def __init__(self) -> None:
        self.mode = "ok"
        self.delay_s = 0.0
        self.calls: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._send(200, b'{"status":"ok"}')

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                fake.calls.append(body)
                time.sleep(fake.delay_s)
                docs = body["documents"]
                ranked = sorted(
                    (
                        {"index": i, "relevance_score": fake_score(body["query"], d, body.get("instruction"))}
                        for i, d in enumerate(docs)
                    ),
                    key=lambda r: -r["relevance_score"],
                )[: body.get("top_n") or len(docs)]
                self._send(200, fake.answer(ranked, len(docs)))

            def _send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)

    def answer(self, ranked: list[dict[str, Any]], n: int) -> bytes:
        meta = {"billed_units": {"search_units": 1}, "tokens": {"input_tokens": 5 * n}}
        usage = {"prompt_tokens": 5 * n, "total_tokens": 5 * n}
        if self.mode == "not_json":
            return b"<html>proxy error</html>"
        if self.mode == "no_results":
            return json.dumps({"id": "x", "meta": meta}).encode()
        if self.mode == "score_is_text":
            ranked = [{**r, "relevance_score": "high"} for r in ranked]
        if self.mode == "one_missing":
            ranked = ranked[:-1]
        if self.mode == "repeated_index":
            ranked = [ranked[0]] * len(ranked)
        if self.mode == "index_out_of_range":
            ranked = [{**ranked[0], "index": n + 3}, *ranked[1:]]
        # Echoed documents and ids: fields the gateway never reads.
        results = [{**r, "document": {"text": "echo"}} for r in ranked]
        return json.dumps({"id": "up-1", "results": results, "meta": meta, "usage": usage}).encode()


@pytest.fixture(scope="module")
def upstream():
    server = RankingUpstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def client(upstream):
    models = (
        PoolEngineConfig(name="cohere", protocol="cohere", urls=(upstream.url,), model="m"),
        PoolEngineConfig(name="vllm", protocol="vllm", urls=(upstream.url,), model="m"),
        PoolEngineConfig(name="infinity", protocol="infinity", urls=(upstream.url,), model="m"),
        PoolEngineConfig(name="split", protocol="cohere", urls=(upstream.url,), model="m", max_batch=3),
    )
    with TestClient(create_app(Settings(models=models), configure_logs=False)) as c:
        yield c


@pytest.fixture(autouse=True)
def _reset(upstream):
    upstream.mode = "ok"
    upstream.delay_s = 0.0
    upstream.calls.clear()


def reference(docs: list[str], top_n: int | None, instruction: str | None) -> list[tuple[int, float]]:
    """The ranking computed directly from the fake model: (index, score), best first, ties by index."""
    scores = [fake_score(Q, d, instruction) for d in docs]
    order = sorted(range(len(docs)), key=lambda i: (-scores[i], i))
    return [(i, scores[i]) for i in order[: top_n or len(docs)]]


def _rerank(client: TestClient, model: str, docs: list[str], **extra: Any) -> list[tuple[int, float]]:
    r = client.post("/v2/rerank", json={"model": model, "query": Q, "documents": docs, **extra})
    assert r.status_code == 200, r.text
    return [(x["index"], x["relevance_score"]) for x in r.json()["results"]]


@pytest.mark.parametrize("model", ["cohere", "vllm", "infinity"])
def test_top_n_is_forwarded_and_results_equal_scoring_everything(client, upstream, model):
    instruction = None if model == "infinity" else "Find rivers"  # infinity has no instruction field
    extra = {"instruction": instruction} if instruction else {}
    cut = _rerank(client, model, DOCS, top_n=3, **extra)
    assert [c["top_n"] for c in upstream.calls] == [3]  # the upstream ranked and cut
    full = _rerank(client, model, DOCS, **extra)
    assert upstream.calls[-1]["top_n"] == len(DOCS)
    expected = reference(DOCS, None, instruction)
    assert full == expected
    assert cut == full[:3] == expected[:3]


def test_top_n_not_smaller_than_the_list_asks_for_everything(client, upstream):
    assert _rerank(client, "cohere", DOCS, top_n=len(DOCS) + 5) == reference(DOCS, None, None)
    assert upstream.calls[-1]["top_n"] == len(DOCS)


def test_duplicates_get_every_score_and_keep_their_positions(client, upstream):
    # Documents 1 and 3 are one item: the best 2 items need not be the best 2 documents.
    docs = [DOCS[0], DOCS[1], DOCS[2], DOCS[1], DOCS[4]]
    got = _rerank(client, "cohere", docs, top_n=2)
    assert [c["top_n"] for c in upstream.calls] == [4]  # every unique text, no cut upstream
    assert got == reference(docs, 2, None)


def test_split_calls_get_every_score_and_merge_in_one_order(client, upstream):
    got = _rerank(client, "split", DOCS, top_n=2)
    assert sorted(len(c["documents"]) for c in upstream.calls) == [2, 3, 3]
    assert all(c["top_n"] == len(c["documents"]) for c in upstream.calls)
    assert got == reference(DOCS, 2, None)


@pytest.mark.parametrize(
    ("mode", "top_n"),
    [
        ("not_json", None),
        ("no_results", 3),
        ("score_is_text", None),
        ("one_missing", None),  # all scores asked for, one missing
        ("one_missing", 3),  # top_n asked for, fewer given
        ("repeated_index", 3),
        ("index_out_of_range", None),
    ],
)
def test_malformed_upstream_answers_are_502(client, upstream, mode, top_n):
    upstream.mode = mode
    body = {"model": "cohere", "query": Q, "documents": DOCS, **({"top_n": top_n} if top_n else {})}
    r = client.post("/v2/rerank", json=body)
    assert r.status_code == 502, r.text
    assert set(r.json()) == {"message", "id", "detail"}
    upstream.mode = "ok"
    assert client.post("/v2/rerank", json=body).status_code == 200  # still serving


def test_transport_failures_map_to_the_error_table(upstream):
    from tests.conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    models = (
        PoolEngineConfig(name="failover", protocol="cohere", urls=(dead, upstream.url), model="m", affinity=False),
        PoolEngineConfig(name="dead", protocol="cohere", urls=(dead,), model="m"),
        PoolEngineConfig(name="slow", protocol="cohere", urls=(upstream.url,), model="m", read_timeout_s=0.3),
    )
    with TestClient(create_app(Settings(models=models), configure_logs=False)) as c:
        body = {"query": Q, "documents": DOCS, "top_n": 2}
        for _ in range(3):  # whichever replica is picked first, the live one answers
            assert c.post("/v2/rerank", json={**body, "model": "failover"}).status_code == 200
        r = c.post("/v2/rerank", json={**body, "model": "dead"})
        assert r.status_code == 503 and "retry-after" in r.headers, r.text
        upstream.delay_s = 1.0
        r = c.post("/v2/rerank", json={**body, "model": "slow"})
        assert r.status_code == 504, r.text


# -- several workers on one port ----------------------------------------------------------------
def _requests_total(text: str) -> float:
    return sum(
        float(m) for m in re.findall(r'^rerank_requests_total\{[^}]*status="200"[^}]*\} (\S+)$', text, re.MULTILINE)
    )


def _post_fresh(url: str) -> int:
    # A new connection per request, so the kernel hands connections to either worker.
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10) as c:
        return c.post(f"{url}/v1/rerank", json={"query": "q", "documents": ["a", "b"]}).status_code


@pytest.mark.slow
def test_two_workers_serve_one_port_and_metrics_sum_both(gateway_server, tmp_path: Path):
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    srv = gateway_server(
        '[server]\nworkers = 2\n[[models]]\nname = "s"\nengine = "static"\n',
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
    )
    sent = 0
    with ThreadPoolExecutor(8) as pool:
        for _ in range(10):  # bounded: at most 160 requests
            statuses = list(pool.map(lambda _: _post_fresh(srv.url), range(16)))
            assert statuses == [200] * 16
            sent += 16
            # prometheus-client writes one file per worker process once it counted something.
            if len({p.name for p in metrics_dir.glob("counter_*.db")}) >= 2:
                break
    assert len(list(metrics_dir.glob("counter_*.db"))) >= 2, "only one worker served"
    for _ in range(6):  # whichever worker takes the scrape, it reports both workers' requests
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10) as c:
            assert _requests_total(c.get(f"{srv.url}/metrics").text) == sent


@pytest.mark.slow
def test_workers_without_a_metrics_dir_get_a_private_one(gateway_server):
    srv = gateway_server('[server]\nworkers = 2\n[[models]]\nname = "s"\nengine = "static"\n')
    for _ in range(12):
        assert _post_fresh(srv.url) == 200
    for _ in range(4):
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10) as c:
            assert _requests_total(c.get(f"{srv.url}/metrics").text) == 12
    srv.stop()
    assert "Traceback" not in srv.log_path.read_text(errors="replace")


@pytest.mark.parametrize("protocol", ["vllm", "vllm-score", "tei", "infinity", "cohere"])
def test_token_estimate_from_the_body_size_matches_counting_every_text(protocol):
    from adapters.upstreams.protocols import UpstreamCall, estimate_tokens, make_protocol

    docs = [f"{d} " * (i % 7 + 1) for i, d in enumerate(DOCS * 12)]
    call = UpstreamCall(Q, "Find rivers", docs)
    body = make_protocol(protocol, model="m", forward_instruction=True).encode(call)
    per_text = sum(len(Q) // 4 + 1 + len(d) // 4 + 1 for d in docs)  # ~4 bytes per token, one pass per text
    assert abs(estimate_tokens(call, len(body)) - per_text) <= 0.1 * per_text
