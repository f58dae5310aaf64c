"""/metrics with several workers (prometheus-client multiprocess mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import Settings, StaticEngineConfig


def test_model_gauges_stay_on_metrics_with_several_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What `serve` sets for server.workers > 1 (gateway.cli._multiprocess_metrics).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    app = create_app(Settings(models=(StaticEngineConfig(name="m"),)), configure_logs=False)
    with TestClient(app) as client:
        text = client.get("/metrics").text
    # Before: only the multiprocess files were rendered; the registry-read gauges (the HPA's and
    # the dashboard's rerank_in_flight_requests, rerank_model_state, ...) were missing.
    for name in (
        "rerank_model_state",
        "rerank_in_flight_requests",
        "rerank_queued_requests",
        "rerank_engine_restarts_total",
    ):
        assert name in text, name
