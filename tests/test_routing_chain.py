"""Fallback chains through the gateway's HTTP API: a pool primary (a loopback Cohere-protocol
upstream whose failures the test switches) in front of a static engine, and their config checks.

Each server scores every document with its own constant, so an answer's scores say which target
computed them: every test checks them against the ``x-rerank-target`` header.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
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
    ChainEngineConfig,
    PoolEngineConfig,
    Settings,
    StaticEngineConfig,
)
from tests.fake_cohere_upstream import CohereUpstream
from tests.test_expected_5xx_log import json_logs  # noqa: F401  # the fixture: the app's JSON log lines

PRIMARY_SCORE, FALLBACK_SCORE = 0.25, 0.75
SCORE_OF = {"primary": PRIMARY_SCORE, "fallback": FALLBACK_SCORE}
BODY = {"model": "chained", "query": "rivers", "documents": ["a river", "a road", "a lake"]}


@pytest.fixture
def upstream() -> Iterator[CohereUpstream]:
    server = CohereUpstream(PRIMARY_SCORE)
    yield server
    server.state.release.set()
    server.close()


def _settings(url: str, **chain: Any) -> Settings:
    extra = {k: chain.pop(k) for k in ("auth", "cache") if k in chain}
    return Settings(
        models=(
            ChainEngineConfig(name="chained", targets=("primary", "fallback"), **{"accepts": "other-models", **chain}),
            # read_timeout_s below timeout_s: a slow replica is a timeout of its own (504 -> next target).
            PoolEngineConfig(
                name="primary",
                protocol="cohere",
                urls=(url,),
                timeout_s=2.0,
                read_timeout_s=0.5,
                max_concurrent_requests=4,
            ),
            StaticEngineConfig(name="fallback", score=FALLBACK_SCORE),
        ),
        **extra,
    )


def _served(response: Any) -> str:
    """The target the header names, after checking every score is that target's."""
    assert response.status_code == 200, response.text
    target = response.headers["x-rerank-target"]
    assert {r["relevance_score"] for r in response.json()["results"]} == {SCORE_OF[target]}
    assert response.json()["model"] == "chained"  # the public name, whoever served
    return str(target)


def _await_probe(chain: Any) -> None:
    """The readmission probe runs in the app's loop: a bounded wait for its verdict on the first target."""
    for _ in range(500):
        if chain.targets[0].admitted:
            return
        time.sleep(0.01)


def _attempts(client: TestClient[Any]) -> dict[tuple[str, str], float]:
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("rerank_route_attempts_total{"):
            labels = dict(part.split("=") for part in line[line.index("{") + 1 : line.index("}")].split(","))
            out[(labels["target"].strip('"'), labels["outcome"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_healthy_primary_serves_and_the_header_log_and_metrics_name_it(upstream, json_logs):
    with TestClient(create_app(_settings(upstream.url), configure_logs=False)) as client:
        json_logs()
        assert _served(client.post("/v2/rerank", json=BODY)) == "primary"
        assert upstream.calls == 1
        assert _attempts(client)[("primary", "served")] == 1
        assert _attempts(client)[("fallback", "served")] == 0
        # An ordinary model's answer has no such header.
        direct = client.post("/v2/rerank", json={**BODY, "model": "fallback"})
        assert direct.status_code == 200 and "x-rerank-target" not in direct.headers
        lines = [x for x in json_logs() if x.get("event") == "request" and x.get("model") == "chained"]
        assert [x.get("target") for x in lines] == ["primary"]


@pytest.mark.parametrize("mode", ["500", "502", "503", "429", "down", "slow"])
def test_each_upstream_failure_moves_on_to_the_next_target(upstream, mode):
    with TestClient(create_app(_settings(upstream.url))) as client:
        if mode == "down":
            upstream.close()  # nothing listens: a transport failure
        else:
            upstream.set(mode, delay_s=3.0)  # slow: past the pool's read_timeout_s
        response = client.post("/v2/rerank", json=BODY)
        assert _served(response) == "fallback"
        outcome = "timeout" if mode == "slow" else "failed"
        assert _attempts(client)[("primary", outcome)] == 1
        # usage counts what the serving target computed (the static engine's count: 1 + 1 per text, + query x 3)
        assert response.json()["meta"]["tokens"]["input_tokens"] == 2 + 2 + 2 + 3


def test_a_request_the_target_refuses_itself_is_answered_as_it_is(upstream):
    upstream.set("400")
    with TestClient(create_app(_settings(upstream.url))) as client:
        response = client.post("/v2/rerank", json=BODY)
        assert response.status_code == 422 and "x-rerank-target" not in response.headers
        assert _attempts(client)[("primary", "refused")] == 1
        assert _attempts(client)[("fallback", "served")] == 0  # never tried


def test_a_target_that_is_not_ready_is_passed_by_without_counting_against_it(upstream):
    app = create_app(_settings(upstream.url))
    with TestClient(app) as client:
        primary = app.state.registry.get("primary")
        primary.state = primary.state.__class__.LOADING
        assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        assert upstream.calls == 0
        chain = app.state.registry.get("chained").chain
        assert chain.targets[0].consecutive_failures == 0
        assert _attempts(client)[("primary", "not_ready")] == 1


def test_a_full_primary_refuses_admission_and_the_next_target_serves(upstream):
    upstream.set("hold")
    app = create_app(_settings(upstream.url))
    with TestClient(app) as client:
        app.state.registry.get("primary").in_flight = 4  # its max_concurrent_requests, as if 4 were running
        assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        assert _attempts(client)[("primary", "overloaded")] == 1
        assert upstream.calls == 0


def test_a_failing_target_is_skipped_for_its_cooldown_then_preferred_again(upstream):
    app = create_app(_settings(upstream.url, eject_after_failures=2, cooldown_s=30.0))
    with TestClient(app) as client:
        chain = app.state.registry.get("chained").chain
        now = [1000.0]
        chain.outliers.clock = lambda: now[0]
        upstream.set("500")
        for _ in range(2):
            assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        assert upstream.calls == 2 and not chain.targets[0].admitted
        upstream.set("ok")
        for _ in range(3):  # cooling down: not called at all
            assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        assert upstream.calls == 2
        assert _attempts(client)[("primary", "skipped")] == 3
        ready = client.get("/ready").json()
        (entry,) = [m for m in ready["models"] if m["name"] == "chained"]
        assert entry["targets"][0]["admitted"] is False and entry["targets"][0]["cooldown_left_s"] == 30.0
        now[0] += 31.0  # the cooldown is over: the next request starts its probe (and is served meanwhile)
        assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        _await_probe(chain)
        assert chain.targets[0].admitted
        assert _served(client.post("/v2/rerank", json=BODY)) == "primary"


def test_the_chain_deadline_holds_across_targets(upstream):
    settings = _settings(upstream.url)
    chain = ChainEngineConfig(name="chained", targets=("primary", "slow"), accepts="replicas", timeout_s=1.0)
    slow = StaticEngineConfig(name="slow", score=FALLBACK_SCORE, delay_s=5.0)
    settings = Settings(models=(chain, settings.models[1], slow))
    upstream.set("500")  # fails at once; the slow target then runs into what is left of the chain's second
    with TestClient(create_app(settings)) as client:
        response = client.post("/v2/rerank", json=BODY)
        assert response.status_code == 504
        assert _attempts(client)[("slow", "timeout")] == 1


def test_a_target_hanging_past_its_share_of_the_deadline_leaves_the_next_one_time_and_is_ejected():
    # The target's own timeout_s (60 s) is longer than the chain's: the chain's timer ends each
    # attempt, at half of what is left while another target remains (attempt_timeout_s unset), so
    # the fallback still answers within the deadline. Those ends count as failures: the hanging
    # target is ejected and later requests go straight to the fallback.
    hung = StaticEngineConfig(name="hung", score=PRIMARY_SCORE, delay_s=30.0)
    fallback = StaticEngineConfig(name="fallback", score=FALLBACK_SCORE)
    chain = ChainEngineConfig(
        name="chained", targets=("hung", "fallback"), accepts="replicas", timeout_s=2.0, eject_after_failures=2
    )
    app = create_app(Settings(models=(chain, hung, fallback)))
    with TestClient(app) as client:
        for _ in range(2):
            started = time.monotonic()
            assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
            assert time.monotonic() - started < 2.0  # within the chain's deadline, not past it
        assert not app.state.registry.get("chained").chain.targets[0].admitted
        assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        assert _attempts(client)[("hung", "timeout")] == 2 and _attempts(client)[("hung", "skipped")] == 1


def test_attempt_timeout_s_gives_an_attempt_the_time_it_names():
    # attempt_timeout_s = timeout_s: the first attempt may spend the whole deadline (the fallback
    # then has none: a 504); a target slower than half the deadline but within it answers.
    slowish = StaticEngineConfig(name="slowish", score=PRIMARY_SCORE, delay_s=0.6)
    fallback = StaticEngineConfig(name="fallback", score=FALLBACK_SCORE)
    whole = ChainEngineConfig(
        name="chained", targets=("slowish", "fallback"), accepts="replicas", timeout_s=1.0, attempt_timeout_s=1.0
    )
    half = ChainEngineConfig(name="halved", targets=("slowish", "fallback"), accepts="replicas", timeout_s=1.0)
    with TestClient(create_app(Settings(models=(whole, half, slowish, fallback)))) as client:
        response = client.post("/v2/rerank", json=BODY)
        assert response.status_code == 200 and response.headers["x-rerank-target"] == "slowish"
        response = client.post("/v2/rerank", json={**BODY, "model": "halved"})
        assert response.status_code == 200 and response.headers["x-rerank-target"] == "fallback"


def test_a_target_that_cannot_do_what_the_request_asks_passes_it_on():
    # Raw scores (vLLM's use_activation: false) from a chain whose first target outputs only
    # [0, 1]: the second, which can, answers; a chain where no target can answers the 422 (not a 503).
    noraw = StaticEngineConfig(name="noraw", score=PRIMARY_SCORE, supports_raw_scores=False)
    raw = StaticEngineConfig(name="raw", score=FALLBACK_SCORE)
    able = ChainEngineConfig(name="able", targets=("noraw", "raw"), accepts="replicas")
    unable = ChainEngineConfig(name="unable", targets=("noraw",), accepts="replicas")
    body = {"text_1": "rivers", "text_2": ["a river", "a road"], "use_activation": False}
    with TestClient(create_app(Settings(models=(able, unable, noraw, raw)))) as client:
        response = client.post("/score", json={**body, "model": "able"})
        assert response.status_code == 200 and response.headers["x-rerank-target"] == "raw", response.text
        assert _attempts(client)[("noraw", "unsupported")] == 1
        response = client.post("/score", json={**body, "model": "unable"})
        # the 422 of the Cohere routes; the vLLM dialect answers it as vLLM does, with a 400
        assert response.status_code == 400 and "raw scores are not available for model 'noraw'" in response.text


def test_a_chain_target_that_is_a_chain_is_readmitted_once_it_can_serve(upstream):
    base = _settings(upstream.url, eject_after_failures=1, cooldown_s=30.0)
    inner = ChainEngineConfig(name="inner", targets=("primary",), accepts="replicas")
    outer = ChainEngineConfig(
        name="chained", targets=("inner", "fallback"), accepts="other-models", eject_after_failures=1, cooldown_s=30.0
    )
    app = create_app(Settings(models=(outer, inner, *base.models[1:])))
    with TestClient(app) as client:
        chain = app.state.registry.get("chained").chain
        now = [1000.0]
        chain.outliers.clock = lambda: now[0]
        upstream.set("500")
        assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        assert not chain.targets[0].admitted
        upstream.set("ok")
        now[0] += 31.0  # the cooldown is over: the next request starts the readmission probe
        assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        _await_probe(chain)
        # A chain has no engine of its own: it was probed by whether a target of it can serve.
        assert chain.targets[0].admitted
        assert _served(client.post("/v2/rerank", json=BODY)) == "primary"


def test_every_target_failing_is_a_503_naming_what_each_did(upstream):
    upstream.set("503")
    settings = _settings(upstream.url)
    settings = Settings(
        models=(
            ChainEngineConfig(name="chained", targets=("primary",), accepts="replicas"),
            settings.models[1],
        )
    )
    with TestClient(create_app(settings)) as client:
        response = client.post("/v2/rerank", json=BODY)
        assert response.status_code == 503 and "Retry-After" in response.headers
        assert "primary: failed" in response.json()["message"]


def test_keys_scoped_to_the_chain_or_to_a_target(upstream):
    chain_key, target_key = generate_key(), generate_key()
    auth = AuthConfig(
        keys=(
            ApiKeyConfig(id="chain-only", hash=hash_key(chain_key), models=("chained",)),
            ApiKeyConfig(id="primary-only", hash=hash_key(target_key), models=("primary",)),
        )
    )
    upstream.set("500")
    with TestClient(create_app(_settings(upstream.url, auth=auth))) as client:

        def post(key: str, model: str) -> Any:
            return client.post("/v2/rerank", json={**BODY, "model": model}, headers={"Authorization": f"Bearer {key}"})

        # The chain's key reaches its fallback through the chain ...
        assert _served(post(chain_key, "chained")) == "fallback"
        # ... but not a target by its own name.
        assert post(chain_key, "fallback").status_code == 403
        # A target's key reaches that target only: not the chain, so never the fallback.
        assert post(target_key, "chained").status_code == 403
        assert post(target_key, "primary").status_code == 502  # the primary's own 500, no fallback


def test_the_cache_never_serves_a_fallbacks_scores_once_the_preferred_model_is_back(upstream):
    cache = CacheConfig(enabled=True)
    with TestClient(create_app(_settings(upstream.url, cache=cache))) as client:
        upstream.set("500")
        first = client.post("/v2/rerank", json=BODY)
        assert _served(first) == "fallback" and first.headers["x-cache"] == "miss"
        upstream.set("ok")
        second = client.post("/v2/rerank", json=BODY)  # other models: the fallback's answer was not kept
        assert _served(second) == "primary" and second.headers["x-cache"] == "miss"
        upstream.set("500")
        third = client.post("/v2/rerank", json=BODY)  # the primary's answer was kept: served as the primary's
        assert _served(third) == "primary" and third.headers["x-cache"] == "hit"


def test_a_chain_of_replicas_caches_any_targets_answer_under_its_name(upstream):
    cache = CacheConfig(enabled=True)
    with TestClient(create_app(_settings(upstream.url, cache=cache, accepts="replicas"))) as client:
        upstream.set("500")
        assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        upstream.set("ok")
        hit = client.post("/v2/rerank", json=BODY)
        assert _served(hit) == "fallback" and hit.headers["x-cache"] == "hit"


def test_spillover_sends_work_on_only_while_the_first_target_is_saturated(upstream):
    upstream.set("hold")
    settings = _settings(upstream.url, mode="spillover", spill_queue_depth=1)
    with TestClient(create_app(settings)) as client:
        held: list[Any] = []
        first = threading.Thread(target=lambda: held.append(client.post("/v2/rerank", json=BODY)))
        first.start()
        assert upstream.state.arrived.wait(10)  # the primary holds one request: its queue is at the bound
        assert _served(client.post("/v2/rerank", json=BODY)) == "fallback"
        upstream.state.release.set()
        first.join(10)
        assert _served(held[0]) == "primary"
        upstream.set("ok")
        assert _served(client.post("/v2/rerank", json=BODY)) == "primary"  # not saturated: the first serves
        assert _attempts(client)[("primary", "spilled")] == 1


# -- config ---------------------------------------------------------------------------------
STATIC = '[[models]]\nname = "{name}"\nengine = "static"\n'


def _chain(targets: str, name: str = "c", extra: str = "") -> str:
    return f'[[models]]\nname = "{name}"\nengine = "chain"\naccepts = "replicas"\ntargets = {targets}\n{extra}'


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        (
            _chain('["a", "nope"]') + STATIC.format(name="a"),
            "models[0].targets[1]: 'nope' is not a configured model name or alias",
        ),
        (_chain('["a", "c"]') + STATIC.format(name="a"), "models[0].targets[1]: chain 'c' names itself"),
        (_chain('["a", "a"]') + STATIC.format(name="a"), "models[0].targets[1]: 'a' names 'a' a second time"),
        (_chain('["d"]') + _chain('["c"]', name="d"), "names form a cycle (c -> d -> c)"),
        (  # c -> [d, a] and d -> [a, b]: a request to c would try a twice
            _chain('["d", "a"]') + _chain('["a", "b"]', name="d") + STATIC.format(name="a") + STATIC.format(name="b"),
            "models[0] (c): reaches 'a' twice (c -> d -> a; c -> a)",
        ),
        (
            _chain('["a"]', extra='mode = "spillover"\n') + STATIC.format(name="a"),
            'mode = "spillover" needs spill_queue_depth or spill_wait_s',
        ),
        (
            _chain('["a"]', extra="spill_queue_depth = 4\n") + STATIC.format(name="a"),
            'apply to mode = "spillover" only',
        ),
        (
            '[[models]]\nname = "c"\nengine = "chain"\ntargets = ["a"]\n' + STATIC.format(name="a"),
            "models[0].accepts is required",
        ),
        (
            _chain('["k"]')
            + STATIC.format(name="a")
            + '[[models]]\nname = "k"\nengine = "cascade"\nstages = [{model = "a", keep = 1}, {model = "a"}]\n',
            "models[0].targets[0]: 'k' is a cascade, which a chain cannot try",
        ),
    ],
)
def test_config_errors_name_the_field(tmp_path: Path, text: str, wanted: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    assert wanted in str(err.value)


def test_a_target_may_be_named_by_its_alias(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(_chain('["alias-of-a"]') + STATIC.format(name="a") + 'aliases = ["alias-of-a"]\n')
    settings = load_settings(path, environ={})
    with TestClient(create_app(settings)) as client:
        response = client.post("/v2/rerank", json={**BODY, "model": "c"})
        assert response.status_code == 200 and response.headers["x-rerank-target"] == "a"


def test_the_tei_and_vllm_dialects_name_the_target_too(upstream):
    upstream.set("500")
    with TestClient(create_app(_settings(upstream.url), configure_logs=False)) as client:
        tei = client.post(
            "/rerank", json={"query": "rivers", "texts": ["a river", "a road"]}
        )  # TEI's body: the first model
        assert tei.status_code == 200 and tei.headers["x-rerank-target"] == "fallback"
        assert {r["score"] for r in tei.json()} == {FALLBACK_SCORE}
        score = client.post("/score", json={"model": "chained", "text_1": "rivers", "text_2": ["a river", "a road"]})
        assert score.status_code == 200 and score.headers["x-rerank-target"] == "fallback"


def test_a_spilled_target_is_tried_last_when_every_other_target_fails(upstream):
    fallback = CohereUpstream(FALLBACK_SCORE)
    try:
        upstream.set("hold")
        fallback.set("500")
        settings = Settings(
            models=(
                ChainEngineConfig(
                    name="chained",
                    targets=("primary", "fallback"),
                    accepts="other-models",
                    mode="spillover",
                    spill_queue_depth=1,
                ),
                PoolEngineConfig(name="primary", protocol="cohere", urls=(upstream.url,), timeout_s=20.0),
                PoolEngineConfig(name="fallback", protocol="cohere", urls=(fallback.url,)),
            )
        )
        app = create_app(settings, configure_logs=False)
        with TestClient(app) as client:
            answers: list[Any] = []
            threads = [
                threading.Thread(target=lambda: answers.append(client.post("/v2/rerank", json=BODY))) for _ in range(2)
            ]
            threads[0].start()
            assert upstream.state.arrived.wait(10)  # the primary holds one: saturated at the bound
            threads[1].start()  # spilled, the fallback fails: back to the primary, tried last
            for _ in range(1000):  # bounded wait for the second request to reach the primary
                if upstream.calls == 2:
                    break
                time.sleep(0.01)
            assert upstream.calls == 2 and fallback.calls == 1
            upstream.state.release.set()
            for thread in threads:
                thread.join(30)
            assert [_served(a) for a in answers] == ["primary", "primary"]
            attempts = _attempts(client)
            assert attempts[("primary", "spilled")] == 1 and attempts[("fallback", "failed")] == 1
            assert attempts[("primary", "served")] == 2
    finally:
        fallback.close()


def test_the_cache_key_follows_every_targets_config_and_ready_follows_the_targets(upstream):
    def fingerprint(fallback_score: float) -> str:
        base = _settings(upstream.url)
        settings = Settings(models=(*base.models[:2], StaticEngineConfig(name="fallback", score=fallback_score)))
        app = create_app(settings, configure_logs=False)
        return str(app.state.registry.get("chained").chain.fingerprint)

    # A restart with a target's scoring changed must not be answered from the old entries (Redis outlives it).
    assert fingerprint(FALLBACK_SCORE) == fingerprint(FALLBACK_SCORE)
    assert fingerprint(FALLBACK_SCORE) != fingerprint(0.5)
    settings = Settings(
        models=(
            ChainEngineConfig(name="chained", targets=("primary",), accepts="replicas"),
            _settings(upstream.url).models[1],
        )
    )
    with TestClient(create_app(settings, configure_logs=False)) as client:
        assert client.get("/ready").json()["models"][0]["state"] == "ready"
        upstream.set("down")  # its only target's replica fails its health check: the chain cannot serve
        (entry, _) = client.get("/ready").json()["models"]
        assert entry["state"] == "unhealthy" and entry["error"] == "no target of the chain can serve"


def test_ready_stays_200_while_the_chain_serves_through_another_target(upstream):
    app = create_app(_settings(upstream.url), configure_logs=False)
    with TestClient(app) as client:
        upstream.set("down")  # the primary fails its health check
        ready = client.get("/ready")
        assert ready.status_code == 200, ready.json()  # the fallback serves the chain: keep the pod in rotation
        states = {m["name"]: m["state"] for m in ready.json()["models"]}
        assert states == {"chained": "ready", "primary": "unhealthy", "fallback": "ready"}
    alone = Settings(models=(_settings(upstream.url).models[1],))  # the same pool without a chain in front
    with TestClient(create_app(alone, configure_logs=False)) as client:
        assert client.get("/ready").status_code == 503
