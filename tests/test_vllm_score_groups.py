"""An N:N vLLM /score request runs one service call per query: it must not overload its own model.

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


def test_a_failing_query_group_answers_at_once_and_cancels_the_others():
    """One group's 400 (a blank query) waited for the other groups' engine work (up to the
    model's timeout_s), which nothing cancelled though its scores were thrown away."""
    import time

    settings = Settings(models=(StaticEngineConfig(name="s", delay_s=20.0),))
    with TestClient(create_app(settings, configure_logs=False)) as c:
        started = time.monotonic()
        resp = c.post("/score", json={"text_1": ["q1", "  "], "text_2": ["a", "b"]})
        elapsed = time.monotonic() - started
        assert resp.status_code == 400, resp.text
        # the other group sleeps 20 s: a wide margin for a loaded machine
        assert elapsed < 10, f"the 400 took {elapsed:.1f} s: it waited for the other group's engine call"
        # The other group's engine work was released: nothing is left in flight on the model.
        assert c.get("/ready").json()["models"][0]["in_flight"] == 0
