"""Review (review-gw): an N:N vLLM /score request must not overload its own model.

The route runs up to four query groups at once, each a service call that takes one of the
model's ``max_concurrent_requests`` slots; with a limit below four, one request on an idle
gateway refused itself with 503.
"""

from __future__ import annotations

from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import Settings, StaticEngineConfig


def test_nn_score_on_an_idle_model_with_a_small_concurrency_limit_is_served():
    settings = Settings(models=(StaticEngineConfig(name="s", delay_s=0.05, max_concurrent_requests=2),))
    with TestClient(create_app(settings, configure_logs=False)) as c:
        resp = c.post("/score", json={"text_1": ["q1", "q2", "q3"], "text_2": ["a", "b", "c"]})
        assert resp.status_code == 200, resp.text
        assert [d["index"] for d in resp.json()["data"]] == [0, 1, 2]
