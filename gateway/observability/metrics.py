"""Usage accounting per API key and model, exposed on ``/metrics`` in the Prometheus format.

Each app has its own :class:`prometheus_client.CollectorRegistry` (not the global one), so
several apps in one process (tests) do not share counters. Labels carry the key's ``id`` from
the config, never the key or its hash; requests without a valid key are ``key="unauthenticated"``
and requests to a gateway without keys ``key="anonymous"``. ``model`` is the canonical model
name (aliases resolved), or ``"-"`` when the request failed before a model was resolved.

``/metrics`` needs no key (Prometheus scrapers rarely hold one); it shows key ids and model
names, no secrets. Keep it off the public network at the load balancer if ids are sensitive.
"""

from __future__ import annotations

import os
from typing import Any

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = ("ANONYMOUS", "NO_MODEL", "UNAUTHENTICATED", "UsageMetrics", "metrics_endpoint")

ANONYMOUS = "anonymous"
UNAUTHENTICATED = "unauthenticated"
NO_MODEL = "-"


class UsageMetrics:
    """Counters per key id x model: requests by status, documents, tokens, search units."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Scrape-time collectors of this process (model state, in-flight): see render().
        self.live: list[Any] = []
        self._requests = Counter(
            "rerank_requests",
            "Rerank requests by API key id, canonical model and HTTP status (failed ones included).",
            ("key", "model", "status"),
            registry=self.registry,
        )
        self._documents = Counter(
            "rerank_documents",
            "Documents in successful rerank requests.",
            ("key", "model"),
            registry=self.registry,
        )
        self._tokens = Counter(
            "rerank_tokens",
            "Input tokens as the engine counts them (query tokens x documents + document tokens); these are what tpm limits.",
            ("key", "model"),
            registry=self.registry,
        )
        self._search_units = Counter(
            "rerank_search_units",
            "Billed search units (Cohere's: one per 100 scored items, at least one per request).",
            ("key", "model"),
            registry=self.registry,
        )
        self._rate_limited = Counter(
            "rerank_rate_limited",
            "Requests refused with 429, by API key id and the limit that refused them.",
            ("key", "limit"),
            registry=self.registry,
        )

        # Labelled children, resolved once per series: labels() costs more than inc() (it
        # validates, joins and locks). Keys are config key ids, canonical models and statuses,
        # so these stay as small as the series themselves.
        self._request_children: dict[tuple[str, str | None, int], Any] = {}
        self._usage_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def record_request(self, key: str, model: str | None, status: int) -> None:
        child = self._request_children.get((key, model, status))
        if child is None:
            child = self._requests.labels(key, model or NO_MODEL, str(status))
            self._request_children[(key, model, status)] = child
        child.inc()

    def record_usage(self, key: str, model: str, *, documents: int, tokens: int, search_units: int) -> None:
        children = self._usage_children.get((key, model))
        if children is None:
            children = self._usage_children[(key, model)] = (
                self._documents.labels(key, model),
                self._tokens.labels(key, model),
                self._search_units.labels(key, model),
            )
        children[0].inc(documents)
        children[1].inc(tokens)
        children[2].inc(search_units)

    def record_rate_limited(self, key: str, limit: str) -> None:
        self._rate_limited.labels(key, limit).inc()

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Several workers (``server.workers``): the counters of every worker process, summed
            # from the files prometheus-client writes there, whichever worker takes the scrape.
            # The model gauges are read from this worker's registry at scrape time (its own models).
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            for collector in self.live:
                registry.register(collector)
            return generate_latest(registry)
        return generate_latest(self.registry)


@get("/metrics", tags=["metrics"], include_in_schema=False, sync_to_thread=False)
def metrics_endpoint(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus text exposition of the usage counters."""
    metrics: UsageMetrics = request.app.state.usage_metrics
    # As a header, not media_type: Litestar appends "; charset=utf-8" to a text/ media type, and
    # CONTENT_TYPE_LATEST has one already; the repeated parameter makes Prometheus 3 fail the scrape.
    return Response(metrics.render(), headers={"content-type": CONTENT_TYPE_LATEST})
