"""Metrics that explain latency, and the Grafana dashboard built on them.

In-process apps (no server process): traffic through the real middleware, service and engines,
then ``/metrics`` parsed with prometheus-client's own parser. The dashboard test takes every
PromQL expression of deploy/grafana/rerank-gateway.json and checks that each metric it names
has samples after traffic, and that docs/operating.md documents every metric family /metrics exposes.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.security.auth import generate_key, hash_key
from schemas.config import (
    ApiKeyConfig,
    AuthConfig,
    CacheConfig,
    DashScopeEngineConfig,
    Settings,
    StaticEngineConfig,
    TransformersEngineConfig,
)
from tests.conftest import ROOT
from tests.test_auth import wait_in_flight

DASHBOARD = ROOT / "deploy" / "grafana" / "rerank-gateway.json"
KEY = generate_key()
DOCS = ["alpha beta", "gamma", "delta epsilon zeta", "alpha beta"]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples(text).items() if n == name and set(labels.items()) <= set(ls))


def dashboard_expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    for var in board["templating"]["list"]:
        query = var.get("query")
        if var["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(rerank_[a-z0-9_]+)\b", expr))


class SteppedClock:
    """A fake ``time.perf_counter``: 1 us per read, plus exactly what :meth:`step` adds.

    The phase metrics then measure what happened, not how fast a loaded machine ran it: the
    static engine's job steps the clock by its ``delay_s``, nothing else does.
    """

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += 1e-6
            return self.now

    def step(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


ENGINE_STEP_S = 0.05  # the static engine's delay_s: one step of the clock per job


@pytest.fixture(scope="module")
def traffic_metrics() -> Iterator[str]:
    """A gateway with a key (rpm 8), the response cache, a model that loads and one that cannot."""
    from adapters.runtimes.static import StaticEngine
    from gateway.serving import telemetry

    clock = SteppedClock()
    score = StaticEngine.score

    async def stepped_score(self: StaticEngine, job: Any) -> Any:
        result = await score(self, job)
        clock.step(ENGINE_STEP_S)
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(time, "perf_counter", clock)
        # RequestTiming's default_factory holds the real perf_counter: start requests on the fake one.
        timing_cls = telemetry.RequestTiming
        mp.setattr(telemetry, "RequestTiming", lambda: timing_cls(started=clock()))
        mp.setattr(StaticEngine, "score", stepped_score)
        text = _traffic()
    yield text  # the real clock again for the module's other tests


def _traffic() -> str:
    settings = Settings(
        models=(
            StaticEngineConfig(name="m", aliases=("m-alias",), delay_s=ENGINE_STEP_S),
            # Fails to load at once (no key in an unset variable), without importing torch.
            DashScopeEngineConfig(name="broken", model="gte-rerank-v2", api_key_env="RERANK_TEST_UNSET_KEY"),
        ),
        auth=AuthConfig(keys=(ApiKeyConfig(id="team", hash=hash_key(KEY), models=("*",), rpm=8),)),
        cache=CacheConfig(enabled=True),
    )
    app = create_app(settings, configure_logs=False)
    headers = {"Authorization": f"Bearer {KEY}"}
    with TestClient(app) as client:
        for path, model in (("/v2/rerank", "m"), ("/v1/rerank", "m-alias"), ("/v2/rerank", "m")):
            resp = client.post(path, json={"model": model, "query": "q", "documents": DOCS}, headers=headers)
            assert resp.status_code == 200, resp.text
        assert (
            client.post(
                "/v2/rerank", json={"model": "broken", "query": "q", "documents": DOCS}, headers=headers
            ).status_code
            == 503
        )
        assert (
            client.post("/v2/rerank", json={"model": "m", "query": " ", "documents": DOCS}, headers=headers).status_code
            == 422
        )
        codes = [
            client.post("/v2/rerank", json={"model": "m", "query": "q", "documents": DOCS}, headers=headers).status_code
            for _ in range(4)
        ]
        assert 429 in codes, codes
        return client.get("/metrics").text


def test_every_dashboard_expression_names_metrics_that_exist(traffic_metrics: str) -> None:
    present = {name for name, _ in samples(traffic_metrics)}
    exprs = dashboard_expressions()
    assert len(exprs) >= 15
    used = set().union(*map(metric_names, exprs))
    assert {"rerank_request_queue_seconds_sum", "rerank_engine_prefix_cache_hits_total"} <= used
    missing = sorted(used - present)
    assert not missing, f"dashboard names metrics /metrics does not have: {missing}"


def test_docs_document_every_metric_family(traffic_metrics: str) -> None:
    readme = (ROOT / "docs" / "operating.md").read_text()  # Operating > Metrics
    families = {f.name for f in text_string_to_metric_families(traffic_metrics)}
    undocumented = sorted(
        f
        for f in families
        if f.startswith("rerank_")
        and not f.endswith("_created")
        and not any(f"`{f}{suffix}`" in readme for suffix in ("", "_total", "_seconds"))
    )
    assert not undocumented, undocumented


def test_phases_split_the_request(traffic_metrics: str) -> None:
    route = {"model": "m", "route": "/v2/rerank"}
    # Scored once per route (v1 through the alias); the repeat on /v2/rerank was a cache hit.
    assert value(traffic_metrics, "rerank_request_engine_seconds_count", **route) == 1
    assert value(traffic_metrics, "rerank_request_engine_seconds_count", model="m", route="/v1/rerank") == 1
    # The static engine's job steps the (fake) clock by 50 ms: that is engine time, not queue or
    # tokenize time. Every other read of the clock adds 1 us, so the bounds below count reads,
    # not how fast this machine ran.
    engine_s = value(traffic_metrics, "rerank_request_engine_seconds_sum", **route)
    assert ENGINE_STEP_S <= engine_s < ENGINE_STEP_S + 1e-3
    queue_s = value(traffic_metrics, "rerank_request_queue_seconds_sum", **route)
    assert queue_s < 1e-3
    assert value(traffic_metrics, "rerank_request_tokenize_seconds_sum", **route) < 1e-3
    total_s = value(traffic_metrics, "rerank_request_duration_seconds_sum", **route)
    # Both /v2/rerank requests: the scored one and the cache hit, each a few clock reads.
    assert engine_s + queue_s <= total_s < ENGINE_STEP_S + 1e-3
    # Every rerank request is in the total: hits, the 503, the 422 and the 429 included.
    assert value(traffic_metrics, "rerank_request_duration_seconds_count", model="broken") == 1
    assert value(traffic_metrics, "rerank_request_duration_seconds_count") == 9
    assert value(traffic_metrics, "rerank_request_items_sum", model="m") == 2 * 3  # dedup: 3 of 4 documents
    assert value(traffic_metrics, "rerank_request_documents_sum", model="m") == 2 * 4
    assert value(traffic_metrics, "rerank_engine_batch_size_count", model="m") == 2


def test_state_load_and_cache_gauges(traffic_metrics: str) -> None:
    assert value(traffic_metrics, "rerank_model_state", model="m", state="ready") == 1
    assert value(traffic_metrics, "rerank_model_state", model="m", state="failed") == 0
    assert value(traffic_metrics, "rerank_model_state", model="broken", state="failed") == 1
    assert value(traffic_metrics, "rerank_in_flight_requests", model="m") == 0
    assert value(traffic_metrics, "rerank_engine_restarts_total", model="m") == 0
    assert value(traffic_metrics, "rerank_response_cache_requests_total", model="m", result="hit") == 4
    assert value(traffic_metrics, "rerank_response_cache_requests_total", model="m", result="miss") == 2


def test_in_flight_gauge_during_a_slow_request() -> None:
    app = create_app(Settings(models=(StaticEngineConfig(name="slow", delay_s=0.5),)), configure_logs=False)
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        # Engines are built off the event loop: wait until the model serves, or the request is a 503.
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").json()
            time.sleep(0.02)
        running = pool.submit(client.post, "/v1/rerank", json={"model": "slow", "query": "q", "documents": ["d"]})
        wait_in_flight(client.get, "slow")
        during = client.get("/metrics").text
        assert running.result().status_code == 200
        after = client.get("/metrics").text
    assert value(during, "rerank_in_flight_requests", model="slow") == 1
    assert value(after, "rerank_in_flight_requests", model="slow") == 0


def test_transformers_engine_reports_queue_steps_and_depth(tiny_qwen3_dir: Path) -> None:
    """Two jobs on one forward-pass slot: the second waits (queue_s > 0); every batch is a step."""
    from adapters.runtimes.transformers import TransformersQwen3Engine, plan_batches

    config = TransformersEngineConfig(
        name="tiny",
        path=str(tiny_qwen3_dir),
        dtype="float32",
        max_length=256,
        max_query_tokens=32,
        batch_tokens=256,
        max_batch_size=4,
    )
    steps: list[tuple[int, int]] = []

    class Recorder:
        def step(self, *, rows: int, tokens: int) -> None:
            steps.append((rows, tokens))

        def prefix_cache(self, *, queries: int, hits: int) -> None:
            raise AssertionError("transformers has no prefix cache")

    async def scenario() -> tuple[Any, Any, list[int], list[list[int]]]:
        engine = TransformersQwen3Engine(config)
        engine.observer = Recorder()
        await engine.start()
        prompt = engine.tokenizer
        assert prompt is not None
        from adapters.base import ScoreJob

        # Hold the first forward pass until the second job is seen waiting for the slot.
        gate = threading.Event()
        real_forward = engine._forward

        def gated_forward(family: Any, rows: list[Any]) -> Any:
            gate.wait(timeout=30)
            return real_forward(family, rows)

        engine._forward = gated_forward
        shared = prompt.encode_shared("what is the capital?", "rank")
        items = prompt.encode_documents([f"document number {i} " * (1 + i % 5) for i in range(24)])
        job = ScoreJob(query="q", instruction="rank", shared_ids=shared, item_ids=items)
        depths = [engine.queue_depth()]
        first = asyncio.ensure_future(engine.score(job))
        second = asyncio.ensure_future(engine.score(job))
        deadline = time.monotonic() + 10
        # The first job's pass runs (held by the gate), the second waits: exactly one queued.
        while engine.queue_depth() != 1:
            assert time.monotonic() < deadline, engine.queue_depth()
            await asyncio.sleep(0.01)
        depths.append(engine.queue_depth())
        await asyncio.sleep(0.2)  # the second job's wait is queue time
        gate.set()
        a, b = await asyncio.gather(first, second)
        depths.append(engine.queue_depth())
        await engine.stop()
        lengths = [len(prompt.assemble(shared, i)) for i in items]
        return (a, b), depths, plan_batches(lengths, batch_tokens=256, max_batch_size=4)

    (a, b), depths, batches = asyncio.run(scenario())
    assert depths == [0, 1, 0]
    assert a.scores == pytest.approx(b.scores)
    # One slot: the second job waited at least while the first pass was held.
    assert b.queue_s >= 0.2
    assert len(steps) == 2 * len(batches)
    assert sorted(r for r, _ in steps) == sorted([len(batch) for batch in batches] * 2)
    assert all(tokens >= rows for rows, tokens in steps)
