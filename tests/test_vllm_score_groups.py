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


def test_a_failing_query_group_answers_at_once_and_cancels_the_others(monkeypatch):
    """One group's 400 (a blank query) waited for the other groups' engine work (up to the
    model's timeout_s), which nothing cancelled though its scores were thrown away.

    Checked by events, not by a wall-clock bound: the other group's engine call (a 20 s sleep)
    had started and was cancelled, never finished, by the time the 400 came back.
    """
    import asyncio

    from adapters.runtimes.static import StaticEngine

    calls: list[str] = []  # per engine call: "started", then "cancelled" or "finished"
    score = StaticEngine.score

    async def observed(self, job):
        calls.append("started")
        try:
            result = await score(self, job)
        except asyncio.CancelledError:
            calls.append("cancelled")
            raise
        calls.append("finished")
        return result

    monkeypatch.setattr(StaticEngine, "score", observed)
    settings = Settings(models=(StaticEngineConfig(name="s", delay_s=20.0),))
    with TestClient(create_app(settings, configure_logs=False)) as c:
        resp = c.post("/score", json={"text_1": ["q1", "  "], "text_2": ["a", "b"]})
        assert resp.status_code == 400, resp.text
        # The other group's call ran and was cancelled: the 400 did not wait for it to finish.
        assert calls == ["started", "cancelled"], calls
        # The other group's engine work was released: nothing is left in flight on the model.
        assert c.get("/ready").json()["models"][0]["in_flight"] == 0
