"""/metrics must carry one well-formed Content-Type: Prometheus 3 fails a scrape whose
Content-Type does not parse (Go's mime.ParseMediaType refuses a repeated parameter)."""

from __future__ import annotations

from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import Settings, StaticEngineConfig


def test_metrics_content_type_has_one_charset() -> None:
    app = create_app(Settings(models=(StaticEngineConfig(name="static"),)), configure_logs=False)
    with TestClient(app) as client:
        resp = client.get("/metrics")
    assert resp.status_code == 200
    ctype = resp.headers["content-type"]
    assert ctype.startswith("text/plain")
    names = [p.split("=", 1)[0].strip().lower() for p in ctype.split(";")[1:]]
    assert len(names) == len(set(names)), f"repeated parameter in {ctype!r}"
    assert "charset" in names
