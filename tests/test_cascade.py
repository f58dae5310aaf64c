"""Cascades (``engine = "cascade"``) through the gateway's HTTP API, on static models whose
scores are set per document, so every position and score of an answer can be computed by hand.

- two and three stages: the last stage's scores and order for what it saw, then what each
  earlier stage dropped (the latest stage's first), scored below the last stage's lowest score;
- ``keep`` at or above the documents sent: exactly the last model alone;
- usage counts every stage; a key scoped to the cascade uses it without its stages' names;
- a stage that fails is the cascade's failure; a stage that is a chain fails over by its rules;
- the config checks: keep where it must (not) be, a stage naming no configured model.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config.settings import ConfigError, load_settings
from gateway.security.auth import generate_key, hash_key
from schemas.config import (
    ApiKeyConfig,
    AuthConfig,
    CacheConfig,
    CascadeEngineConfig,
    CascadeStage,
    ChainEngineConfig,
    Settings,
    StaticEngineConfig,
    TransformersEngineConfig,
)
from tests.loopback import wait_loaded

DOCS = ["d0 x", "d1 x", "d2 x", "d3 x", "d4 x"]
FAST = {"d0 x": 0.1, "d1 x": 0.9, "d2 x": 0.8, "d3 x": 0.3, "d4 x": 0.7}  # order d1 d2 d4 d3 d0
MID = {"d1 x": 0.2, "d2 x": 0.5, "d3 x": 0.9, "d4 x": 0.1}  # of d1 d2 d3 d4: d3 d2 d1 d4
SLOW = {"d0 x": 0.05, "d1 x": 0.4, "d2 x": 0.6, "d3 x": 0.5, "d4 x": 0.45}


def _cascade(name: str, *stages: tuple[str, int | None]) -> CascadeEngineConfig:
    return CascadeEngineConfig(name=name, stages=tuple(CascadeStage(model=m, keep=k) for m, k in stages))


def _settings(**extra: Any) -> Settings:
    return Settings(
        models=(
            StaticEngineConfig(name="fast", scores=FAST),
            StaticEngineConfig(name="mid", scores=MID),
            StaticEngineConfig(name="slow", scores=SLOW),
            _cascade("two", ("fast", 2), ("slow", None)),
            _cascade("three", ("fast", 4), ("mid", 2), ("slow", None)),
            _cascade("all", ("fast", 10), ("slow", None)),
            # A stage that cannot load (no such directory), alone and behind a chain that falls back.
            TransformersEngineConfig(name="broken", path="/nonexistent/checkpoint", device="cpu"),
            _cascade("fails", ("broken", 2), ("slow", None)),
            ChainEngineConfig(name="guarded", targets=("broken", "fast"), accepts="other-models"),
            _cascade("chained", ("guarded", 2), ("slow", None)),
        ),
        **extra,
    )


def _rerank(client: TestClient[Any], model: str, **kw: Any) -> Any:
    return client.post("/v2/rerank", json={"model": model, "query": "q", "documents": DOCS, **kw})


def _pairs(response: Any) -> list[tuple[int, float]]:
    assert response.status_code == 200, response.text
    return [(r["index"], r["relevance_score"]) for r in response.json()["results"]]


def _same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    return [i for i, _ in got] == [i for i, _ in want] and [s for _, s in got] == pytest.approx([s for _, s in want])


def _tokens(response: Any) -> int:
    return int(response.json()["meta"]["tokens"]["input_tokens"])


def test_the_last_stage_orders_what_it_saw_and_the_dropped_follow_in_their_stages_order() -> None:
    with TestClient(create_app(_settings(), configure_logs=False)) as client:
        wait_loaded(client)
        # fast keeps d1 d2; slow: d2 .6, d1 .4; then fast's dropped d4 d3 d0 at .4 x 3/4, 2/4, 1/4.
        assert _same(_pairs(_rerank(client, "two")), [(2, 0.6), (1, 0.4), (4, 0.3), (3, 0.2), (0, 0.1)])
        # fast keeps d1 d2 d4 d3 (drops d0); mid keeps d3 d2 (drops d1, d4); slow: d2 .6, d3 .5;
        # then mid's dropped d1 d4, then fast's d0, at .5 x 3/4, 2/4, 1/4.
        assert _same(_pairs(_rerank(client, "three")), [(2, 0.6), (3, 0.5), (1, 0.375), (4, 0.25), (0, 0.125)])
        assert _same(_pairs(_rerank(client, "three", top_n=3)), [(2, 0.6), (3, 0.5), (1, 0.375)])
        # keep >= the documents sent: the last model alone, to the score.
        alone = _rerank(client, "slow")
        assert _pairs(_rerank(client, "all")) == _pairs(alone)
        # Usage counts every stage: fast on all five documents, slow on the two it kept.
        fast_all = _tokens(_rerank(client, "fast"))
        slow_two = _tokens(client.post("/v2/rerank", json={"model": "slow", "query": "q", "documents": DOCS[1:3]}))
        both = _rerank(client, "two").json()
        assert both["meta"]["tokens"]["input_tokens"] == both["usage"]["total_tokens"] == fast_all + slow_two
        assert both["model"] == "two"
        ready = {m["name"]: m for m in client.get("/ready").json()["models"]}
        assert ready["three"]["stages"] == [
            {"model": "fast", "keep": 4, "state": "ready"},
            {"model": "mid", "keep": 2, "state": "ready"},
            {"model": "slow", "keep": None, "state": "ready"},
        ]


def test_the_dropped_stay_below_a_last_stage_score_of_zero_in_their_order() -> None:
    # A share of a floor of 0 (or a negative one: logits of a raw_scores stage) is not below it:
    # then the dropped documents step down from it by 1, still in their stage's order.
    zero = StaticEngineConfig(name="zero", scores={"d1 x": 0.0, "d2 x": 0.6})
    settings = Settings(
        models=(StaticEngineConfig(name="fast", scores=FAST), zero, _cascade("z", ("fast", 2), ("zero", None)))
    )
    with TestClient(create_app(settings, configure_logs=False)) as client:
        wait_loaded(client)
        # fast keeps d1 d2; zero: d2 .6, d1 0; then fast's dropped d4 d3 d0 at -1, -2, -3.
        assert _same(_pairs(_rerank(client, "z")), [(2, 0.6), (1, 0.0), (4, -1.0), (3, -2.0), (0, -3.0)])


def test_a_failing_stage_fails_the_cascade_and_a_chain_stage_fails_over() -> None:
    with TestClient(create_app(_settings(), configure_logs=False)) as client:
        wait_loaded(client)
        failed = _rerank(client, "fails")
        assert failed.status_code == 503 and "model 'broken' failed to load" in failed.json()["message"]
        # guarded: broken is down, so fast serves the first stage, as it does for "two".
        assert _pairs(_rerank(client, "chained")) == _pairs(_rerank(client, "two"))


def test_a_cascade_through_a_chain_of_other_models_is_not_cached() -> None:
    # "chained"'s first stage is served by the chain's fallback (broken is down): another model's
    # scores. Cached under the cascade's name, that answer would be served for as long as the cache
    # keeps it, also once the preferred model is back. "two" (no such stage) is cached as before.
    with TestClient(create_app(_settings(cache=CacheConfig(enabled=True)), configure_logs=False)) as client:
        wait_loaded(client)
        assert [_rerank(client, "chained").headers["x-cache"] for _ in range(2)] == ["miss", "miss"]
        assert [_rerank(client, "two").headers["x-cache"] for _ in range(2)] == ["miss", "hit"]


def test_a_key_scoped_to_the_cascade_reaches_it_without_its_stages() -> None:
    key = generate_key()
    auth = AuthConfig(keys=(ApiKeyConfig(id="c", hash=hash_key(key), models=("two",)),))
    with TestClient(create_app(_settings(auth=auth), configure_logs=False)) as client:
        wait_loaded(client)
        headers = {"Authorization": f"Bearer {key}"}
        assert (
            client.post(
                "/v2/rerank", headers=headers, json={"model": "two", "query": "q", "documents": DOCS}
            ).status_code
            == 200
        )
        assert (
            client.post(
                "/v2/rerank", headers=headers, json={"model": "slow", "query": "q", "documents": DOCS}
            ).status_code
            == 403
        )


@pytest.mark.parametrize(
    ("stages", "error"),
    [
        ([{"model": "fast"}, {"model": "slow"}], "stages[0] (fast): keep is required on every stage but the last"),
        ([{"model": "fast", "keep": 2}, {"model": "slow", "keep": 1}], "stages[1] (slow): the last stage orders"),
        (
            [{"model": "fast", "keep": 2}, {"model": "mid", "keep": 3}, {"model": "slow"}],
            "stages[1].keep (3) is above stages[0].keep (2)",
        ),
        ([{"model": "fast", "keep": 2}], "models[3].stages: must have at least 2 item(s)"),
        ([{"model": "fast", "keep": 2}, {"model": "nope"}], "models[3].stages[1]: 'nope' is not a configured model"),
    ],
)
def test_config_refusals(tmp_path: Any, stages: list[dict[str, Any]], error: str) -> None:
    models = (
        '[[models]]\nname = "fast"\nengine = "static"\n[[models]]\nname = "mid"\nengine = "static"\n'
        '[[models]]\nname = "slow"\nengine = "static"\n'
    )
    tables = ", ".join("{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in stage.items()) + "}" for stage in stages)
    path = tmp_path / "c.toml"
    path.write_text(models + f'[[models]]\nname = "c"\nengine = "cascade"\nstages = [{tables}]\n')
    with pytest.raises(ConfigError) as info:
        load_settings(str(path))
    assert error in str(info.value)


def test_raw_scores_are_refused_on_a_cascade() -> None:
    with TestClient(create_app(_settings(), configure_logs=False)) as client:
        wait_loaded(client)
        # vLLM's spelling of raw scores (the static stages could answer raw: the cascade may not).
        body = {"model": "two", "text_1": "q", "text_2": DOCS, "use_activation": False}
        refused = client.post("/score", json=body)
        assert refused.status_code in (400, 422), refused.text
        assert "raw scores are not available for model 'two': a cascade's answer joins" in refused.text
        assert client.post("/score", json={**body, "use_activation": True}).status_code == 200
