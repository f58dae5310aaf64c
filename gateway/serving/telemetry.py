"""Metrics that explain latency: where a request's time went, how busy each model is, what the
engines batch. Registered on the same per-app registry as the usage counters (``/metrics``).

A rerank request's time is split into phases, each a histogram labelled by canonical ``model``
and ``route`` (the route template, e.g. ``/v2/rerank``; never the raw path, so a scanner cannot
blow up the series count):

- ``queue``: waiting to be admitted (API key, rate limits, Redis) plus the time the job waited
  inside the engine for a free slot (the transformers engine's forward-pass limiter; vLLM queues
  inside its own scheduler, which is part of ``engine`` there);
- ``tokenize``: the gateway's tokenization, truncation and chunking (``x-tokenize-time-ms``);
- ``engine``: scoring minus the engine's own queue (``x-inference-time-ms`` minus that queue);
- ``total``: the whole request as the gateway saw it, failed requests included.

Model state, in-flight and queued requests and engine restarts are read from the model registry
at scrape time (a custom collector), so they can never drift from what ``/ready`` shows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.observability import tracing

if TYPE_CHECKING:
    from gateway.serving.models import ModelRegistry

__all__ = ("GatewayTelemetry", "ModelObserver", "RequestTiming", "record_phases", "request_timing")

NO_MODEL = "-"
_STATES = ("loading", "ready", "failed", "unhealthy")
# Seconds: 1 ms .. 60 s (the default model timeout), denser where rerank requests land.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
_TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)


@dataclass(slots=True)
class RequestTiming:
    """One request's phases, filled by the access middleware (admission) and the service."""

    started: float = field(default_factory=time.perf_counter)
    admission_s: float = 0.0
    # Set by the service once the engine answered; None: the request never reached scoring.
    engine_queue_s: float | None = None
    tokenize_s: float = 0.0
    engine_s: float = 0.0
    documents: int = 0
    items: int = 0
    cache: str | None = None  # "hit" | "miss" when the response cache is on


_current: ContextVar[RequestTiming | None] = ContextVar("rerank_request_timing", default=None)


@contextmanager
def request_timing() -> Iterator[RequestTiming]:
    timing = RequestTiming()
    token = _current.set(timing)
    try:
        yield timing
    finally:
        _current.reset(token)


def current_timing() -> RequestTiming | None:
    return _current.get()


def record_phases(*, queue_s: float, tokenize_s: float, inference_s: float, documents: int, items: int) -> None:
    """Called by the service after scoring; ``inference_s`` includes the engine's ``queue_s``."""
    timing = _current.get()
    if timing is None:  # the service used as a library, outside an HTTP request
        return
    timing.engine_queue_s = queue_s
    timing.tokenize_s = tokenize_s
    timing.engine_s = max(0.0, inference_s - queue_s)
    timing.documents, timing.items = documents, items


class ModelObserver:
    """:class:`adapters.base.EngineObserver` for one model: engine steps and prefix-cache lookups."""

    def __init__(self, telemetry: GatewayTelemetry, model: str) -> None:
        self._batch = telemetry.batch_size.labels(model)
        self._tokens = telemetry.batch_tokens.labels(model)
        self._queries = telemetry.prefix_queries.labels(model)
        self._hits = telemetry.prefix_hits.labels(model)

    def step(self, *, rows: int, tokens: int) -> None:
        self._batch.observe(rows)
        self._tokens.observe(tokens)
        tracing.engine_step(rows, tokens)  # the step's span, when the request's own task ran it

    def prefix_cache(self, *, queries: int, hits: int) -> None:
        self._queries.inc(queries)
        self._hits.inc(hits)


class _ModelStateCollector(Collector):
    """Per-model gauges read from the registry when Prometheus scrapes."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        state = GaugeMetricFamily(
            "rerank_model_state",
            "1 for the model's current state (loading, ready, failed, unhealthy), else 0.",
            labels=("model", "state"),
        )
        in_flight = GaugeMetricFamily(
            "rerank_in_flight_requests",
            "Rerank requests admitted to the model and not finished (running + waiting).",
            labels=("model",),
        )
        queued = GaugeMetricFamily(
            "rerank_queued_requests",
            "Requests waiting inside the engine for their first step (engines that can tell: transformers, static = 0).",
            labels=("model",),
        )
        restarts = CounterMetricFamily(
            "rerank_engine_restarts", "Engines restarted after they died, per model.", labels=("model",)
        )
        for rt in self._registry:
            for name in _STATES:
                state.add_metric((rt.name, name), 1.0 if rt.state.value == name else 0.0)
            in_flight.add_metric((rt.name,), float(rt.in_flight))
            depth = getattr(rt.engine, "queue_depth", None)
            queued.add_metric((rt.name,), float(depth()) if callable(depth) else 0.0)
            restarts.add_metric((rt.name,), float(rt.restarts))
        return [state, in_flight, queued, restarts]


class GatewayTelemetry:
    """The latency, load and engine metrics of one app, on ``registry``."""

    def __init__(self, registry: CollectorRegistry, live: list[Collector] | None = None) -> None:
        self.registry = registry
        # Collectors read at scrape time from this process's state, which prometheus-client's
        # multiprocess files do not hold: /metrics renders them beside those files (workers > 1).
        self.live = live if live is not None else []

        def phase(name: str, what: str) -> Histogram:
            return Histogram(name, what, ("model", "route"), buckets=_LATENCY_BUCKETS, registry=registry)

        self.total = phase(
            "rerank_request_duration_seconds", "Whole rerank request as the gateway saw it, failures included."
        )
        self.queue = phase(
            "rerank_request_queue_seconds", "Waiting for admission (key, limits) and for a free engine slot."
        )
        self.tokenize = phase(
            "rerank_request_tokenize_seconds", "Tokenization, truncation and chunking in the gateway."
        )
        self.engine = phase("rerank_request_engine_seconds", "Scoring in the engine or upstream, its queue excluded.")
        self.documents = Histogram(
            "rerank_request_documents",
            "Documents per successful rerank request.",
            ("model",),
            buckets=_COUNT_BUCKETS,
            registry=registry,
        )
        self.items = Histogram(
            "rerank_request_items",
            "Items scored per successful request (after dedup and chunking).",
            ("model",),
            buckets=_COUNT_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "rerank_engine_batch_size",
            "Items per engine step (forward pass or vLLM scheduler step).",
            ("model",),
            buckets=_COUNT_BUCKETS,
            registry=registry,
        )
        self.batch_tokens = Histogram(
            "rerank_engine_batch_tokens",
            "Tokens per engine step (padded for transformers).",
            ("model",),
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.prefix_queries = Counter(
            "rerank_engine_prefix_cache_queries",
            "Prompt tokens looked up in the engine's prefix cache (vLLM).",
            ("model",),
            registry=registry,
        )
        self.prefix_hits = Counter(
            "rerank_engine_prefix_cache_hits",
            "Prompt tokens found in the engine's prefix cache (vLLM).",
            ("model",),
            registry=registry,
        )
        # (model, route) -> its histogram children; routes are templates, so this stays small.
        self._children: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.cache = Counter(
            "rerank_response_cache_requests",
            "Rerank requests looked up in the response cache, by result.",
            ("model", "result"),
            registry=registry,
        )
        self.route_attempts = Counter(
            "rerank_route_attempts",
            "Chain attempts per chain model, target and outcome (served, not_ready, overloaded, spilled, timeout, "
            "failed, refused, skipped: see docs/routing.md).",
            ("model", "target", "outcome"),
            registry=registry,
        )

    def attach(self, models: ModelRegistry, *, cache_enabled: bool = False) -> None:
        """Give every model an engine observer and expose the registry's state gauges."""
        for rt in models:
            if rt.chain is not None:
                rt.chain.observe = self._route_observer()
                for target in rt.chain.targets:  # series from the start, as above
                    self.route_attempts.labels(rt.name, target.name, "served")
            rt.observer = ModelObserver(self, rt.name)
            # Series exist (at 0) from the start, so rates and dashboards have data before traffic.
            for metric in (self.prefix_queries, self.prefix_hits):
                metric.labels(rt.name)
            if cache_enabled:
                for result in ("hit", "miss"):
                    self.cache.labels(rt.name, result)
        collector = _ModelStateCollector(models)
        self.registry.register(collector)
        self.live.append(collector)

    def _route_observer(self) -> Any:
        children: dict[tuple[str, str, str], Any] = {}

        def observe(model: str, target: str, outcome: str) -> None:
            child = children.get((model, target, outcome))
            if child is None:  # labels() once per series, as in observe()
                child = children[(model, target, outcome)] = self.route_attempts.labels(model, target, outcome)
            child.inc()

        return observe

    def observe(self, timing: RequestTiming, *, model: str | None, route: str) -> None:
        """A rerank request finished (any status): record its phases."""
        model = model or NO_MODEL
        children = self._children.get((model, route))
        if children is None:  # labels() costs as much as observe(): resolve once per series
            children = self._children[(model, route)] = (
                self.total.labels(model, route),
                self.queue.labels(model, route),
                self.tokenize.labels(model, route),
                self.engine.labels(model, route),
                self.documents.labels(model),
                self.items.labels(model),
            )
        total, queue, tokenize, engine, documents, items = children
        total.observe(time.perf_counter() - timing.started)
        if timing.cache is not None and model != NO_MODEL:
            self.cache.labels(model, timing.cache).inc()
        if timing.engine_queue_s is None:  # failed before scoring, or answered from the cache
            return
        queue.observe(timing.admission_s + timing.engine_queue_s)
        tokenize.observe(timing.tokenize_s)
        engine.observe(timing.engine_s)
        documents.observe(timing.documents)
        items.observe(timing.items)
