"""Hosted rerank providers (Cohere, Jina AI, Voyage AI, Mixedbread, NVIDIA, Together) through the
whole gateway, against the strict fakes of tests/fake_providers.py on loopback.

One fake server and one gateway app serve every provider (module-scoped); each test is
parametrized over the providers, and the error test over each provider's documented statuses.
"""

from __future__ import annotations

import json
import math
import os
import tempfile

import pytest
import structlog

from adapters.upstreams.hosted.providers import PROVIDERS, Outcome
from gateway.config.settings import ConfigError, load_settings
from schemas.config import (
    ChainEngineConfig,
    CohereEngineConfig,
    JinaEngineConfig,
    MixedbreadEngineConfig,
    NvidiaEngineConfig,
    Settings,
    TogetherEngineConfig,
    VoyageEngineConfig,
)
from tests.fake_providers import SPECS, FakeProviders, Fault, Limits, fake_score, fake_tokens
from tests.hosted_gateway import DOCS, Q, assert_ranked, gateway_client, rerank

CONFIGS = {
    "cohere": CohereEngineConfig,
    "jina": JinaEngineConfig,
    "voyage": VoyageEngineConfig,
    "mixedbread": MixedbreadEngineConfig,
    "nvidia": NvidiaEngineConfig,
    "together": TogetherEngineConfig,
}
NAMES = sorted(CONFIGS)
KEYS = {name: f"{name}-secret-key-0123456789abcdef" for name in NAMES}
ENV = {name: f"RERANK_TEST_{name.upper()}_KEY" for name in NAMES}
WRONG = "wrong-secret-key-fedcba9876543210"
# Small limits, the same in the fake and in the gateway's config, so a split shows with a few documents.
MAX_DOCS = 4
VOYAGE_TOKENS = 400


def _model(provider: str, name: str, fake: FakeProviders, **kw: object) -> object:
    base: dict[str, object] = {
        "model": f"{provider}-model",
        "base_url": fake.base_url(provider),
        "api_key_env": ENV[provider],
        "max_documents_per_call": MAX_DOCS,
        "retries": 2,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
    }
    if provider == "nvidia":
        base["path"] = "/v1/ranking"  # a self-hosted NIM's path (the catalog's is the default)
    if provider == "voyage":
        base["max_tokens_per_request"] = VOYAGE_TOKENS
    return CONFIGS[provider](name=name, **{**base, **kw})


STARTUP_LOGS: list[dict[str, object]] = []


@pytest.fixture(scope="module")
def fake():
    limits = {name: Limits(max_documents=MAX_DOCS) for name in NAMES}
    limits["voyage"] = Limits(max_documents=MAX_DOCS, max_request_tokens=VOYAGE_TOKENS)
    with FakeProviders(KEYS, limits) as server:
        yield server


@pytest.fixture(scope="module")
def key_file():
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cohere.key")
        with open(path, "w") as file:
            file.write(KEYS["cohere"] + "\n")  # a trailing newline, as `echo` writes it
        yield path


@pytest.fixture(scope="module")
def client(fake, key_file):
    with pytest.MonkeyPatch.context() as env:
        for name in NAMES:
            env.setenv(ENV[name], KEYS[name])
        models = []
        for p in NAMES:
            models += [
                _model(p, p, fake),
                _model(p, f"{p}-slow", fake, read_timeout_s=0.3),
                _model(p, f"{p}-badkey", fake, api_key=WRONG, api_key_env=None),
            ]
        models += [
            _model("cohere", "cohere-file", fake, api_key_file=key_file, api_key_env="RERANK_TEST_UNSET_VARIABLE"),
            _model("voyage", "voyage-nokey", fake, api_key_env="RERANK_TEST_UNSET_VARIABLE"),
            # A hosted provider as a fallback chain's target: Cohere first, Voyage behind it.
            ChainEngineConfig(name="hosted-chain", targets=("cohere", "voyage"), accepts="other-models"),
        ]
        with gateway_client(Settings(models=tuple(models)), STARTUP_LOGS) as c:
            yield c


@pytest.fixture(autouse=True)
def _fresh(fake):
    fake.clear()
    yield
    assert fake.pending() == 0, "a scripted fault was not consumed"


def _documents(provider, call):
    if provider == "nvidia":
        return [p["text"] for p in call.body["passages"]]
    return call.body["input" if provider == "mixedbread" else "documents"]


EXPECTED_BODY = {
    "cohere": lambda docs: {
        "model": "cohere-model",
        "query": Q,
        "documents": docs,
        "top_n": len(docs),
        "max_tokens_per_doc": 4096,
    },
    "jina": lambda docs: {
        "model": "jina-model",
        "query": Q,
        "documents": docs,
        "top_n": len(docs),
        "return_documents": False,
    },
    "voyage": lambda docs: {
        "model": "voyage-model",
        "query": Q,
        "documents": docs,
        "top_k": len(docs),
        "return_documents": False,
        "truncation": True,
    },
    "mixedbread": lambda docs: {
        "model": "mixedbread-model",
        "query": Q,
        "input": docs,
        "top_k": len(docs),
        "return_input": False,
    },
    "nvidia": lambda docs: {
        "model": "nvidia-model",
        "query": {"text": Q},
        "passages": [{"text": d} for d in docs],
        "truncate": "END",
    },
    "together": lambda docs: {
        "model": "together-model",
        "query": Q,
        "documents": docs,
        "top_n": len(docs),
        "return_documents": False,
    },
}


@pytest.mark.parametrize("provider", NAMES)
def test_scores_map_back_to_their_documents_across_split_calls(client, fake, provider):
    # 5 documents, 4 per call: two calls, merged back in global order.
    body = assert_ranked(rerank(client, provider, top_n=3, return_documents=True), 3)
    calls = sorted(fake.requests, key=lambda c: DOCS.index(_documents(provider, c)[0]))
    assert [_documents(provider, c) for c in calls] == [DOCS[:4], DOCS[4:]]
    assert [c.body for c in calls] == [EXPECTED_BODY[provider](DOCS[:4]), EXPECTED_BODY[provider](DOCS[4:])]
    assert all(c.headers["authorization"] == f"Bearer {KEYS[provider]}" for c in calls)
    if provider == "nvidia":  # NIM reports no usage: the gateway's estimate (bytes / 3) of both calls
        assert body["usage"]["total_tokens"] >= fake_tokens(Q) * 5 + sum(map(fake_tokens, DOCS))
    else:  # the sum of what the provider reported for each call
        assert body["usage"]["total_tokens"] == fake_tokens(Q) * 5 + sum(map(fake_tokens, DOCS))


def test_voyage_token_limit_splits_calls_within_its_budget(client, fake):
    # ~380-byte documents: 4 per call (the document limit) would be ~424 tokens by the fake's count,
    # over Voyage's 400 (query tokens x documents + document tokens): the token budget must split them.
    docs = [f"{i} " + "lorem ipsum dolor sit amet " * 14 for i in range(12)]
    r = rerank(client, "voyage", documents=docs)
    assert r.status_code == 200, r.text  # a call over the limit would have been the fake's 400 -> 422
    scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert scores == {i: pytest.approx(fake_score(Q, d), abs=1e-9) for i, d in enumerate(docs)}
    assert len(fake.requests) >= 3
    sent = sorted((docs.index(c.body["documents"][0]), c.body["documents"]) for c in fake.requests)
    assert [d for _, part in sent for d in part] == docs  # each document once, in consecutive slices


def test_cohere_sends_the_smaller_max_tokens_per_doc(client, fake):
    r = client.post(
        "/v2/rerank", json={"model": "cohere", "query": Q, "documents": DOCS[:2], "max_tokens_per_doc": 100}
    )
    assert r.status_code == 200, r.text
    (call,) = fake.requests
    assert call.body["max_tokens_per_doc"] == 100


# Every documented status of every provider, and what the client must get for it.
CASES = [(p, status) for p in NAMES for status in sorted(PROVIDERS[CONFIGS[p]].statuses) if status != 404]


@pytest.mark.parametrize(("provider", "status"), CASES, ids=[f"{p}-{s}" for p, s in CASES])
def test_each_documented_status_is_mapped(client, fake, provider, status):
    outcome = PROVIDERS[CONFIGS[provider]].outcome(status)
    fake.fail_next(provider, Fault(status, f"documented {status} text"))
    r = rerank(client, provider, documents=DOCS[:2])
    if outcome is Outcome.RETRY:  # retried once, then the fake answers
        assert r.status_code == 200, r.text
        assert len(fake.requests) == 2
        return
    assert len(fake.requests) == 1  # never retried
    if outcome is Outcome.INPUT:
        assert r.status_code == 422, r.text
        assert f"documented {status} text" in r.json()["message"]
    elif outcome is Outcome.ACCOUNT:
        assert r.status_code == 502, r.text
        assert r.json()["message"] == "the model's engine failed to score this request"
    else:
        raise AssertionError(f"no expectation for {outcome}")


@pytest.mark.parametrize("provider", NAMES)
def test_missing_model_or_path_is_a_misconfiguration(client, fake, provider):
    fake.fail_next(provider, Fault(404, "model 'x' not found"))
    r = rerank(client, provider, documents=DOCS[:2])
    assert r.status_code == 502
    assert "is misconfigured" in r.json()["message"] and "retrying will not help" in r.json()["message"]
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", ["cohere", "together", "mixedbread", "voyage"])
def test_500_is_retried_where_the_docs_say_so(client, fake, provider):
    assert PROVIDERS[CONFIGS[provider]].outcome(500) is Outcome.RETRY
    fake.fail_next(provider, Fault(500), Fault(500))
    assert rerank(client, provider, documents=DOCS[:2]).status_code == 200
    assert len(fake.requests) == 3


@pytest.mark.parametrize("provider", ["jina", "nvidia"])
def test_500_where_the_docs_do_not_say_retry_is_a_502_at_once(client, fake, provider):
    fake.fail_next(provider, Fault(500))
    assert rerank(client, provider, documents=DOCS[:2]).status_code == 502
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", NAMES)
def test_429_waits_for_retry_after(client, fake, provider):
    fake.fail_next(provider, Fault(429, "slow down", headers={"Retry-After": "1"}))
    r = rerank(client, provider, documents=DOCS[:2])
    assert r.status_code == 200, r.text
    first, second = fake.requests
    # The gap measured by the fake's arrival times: the backoff alone (0.05-0.1 s) would be far shorter.
    assert second.at - first.at >= 0.95


@pytest.mark.parametrize("provider", NAMES)
def test_persistent_throttling_is_503_with_retry_after(client, fake, provider):
    fake.fail_next(provider, *[Fault(429, "slow down", headers={"Retry-After": "0"})] * 3)
    r = rerank(client, provider, documents=DOCS[:2])
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert "rate limited" in r.json()["message"]
    assert len(fake.requests) == 3  # the first try and retries = 2 more


def test_retry_after_past_the_deadline_is_not_waited_for(client, fake):
    fake.fail_next("together", Fault(429, "slow down", headers={"Retry-After": "120"}))
    r = rerank(client, "together", documents=DOCS[:2])
    assert r.status_code == 503
    assert r.headers["retry-after"] == "120"
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", NAMES)
def test_hanging_provider_is_504(client, fake, provider):
    # The fake holds the answer until the server closes (or 5 s): only read_timeout_s ends the call.
    fake.fail_next(provider, Fault(raw=b"{}", delay_s=5))
    r = rerank(client, f"{provider}-slow", documents=DOCS[:2])
    assert r.status_code == 504
    assert r.json()["message"] == "the model's engine did not answer in time"


# Cut JSON, not JSON, and a well-formed answer with no results: one per provider (a 502 logs its
# traceback, ~1.5 s each), every kind twice.
MALFORMED = [b'{"results": [', b"<html>oops</html>", b'{"results": [], "data": [], "rankings": []}'] * 2


@pytest.mark.parametrize(("provider", "raw"), list(zip(NAMES, MALFORMED)), ids=NAMES)
def test_malformed_answer_is_502(client, fake, provider, raw):
    fake.fail_next(provider, Fault(raw=raw))
    r = rerank(client, provider, documents=DOCS[:2])
    assert r.status_code == 502
    assert r.json()["message"] == "the model's engine failed to score this request"


@pytest.mark.parametrize("provider", NAMES)
def test_refused_key_is_502_and_no_key_is_ever_logged_or_shown(client, fake, provider):
    # The fake's 401 quotes the key it got; the gateway must cut it out everywhere.
    with structlog.testing.capture_logs() as logs:
        refused = rerank(client, f"{provider}-badkey", documents=DOCS[:2])
        served = rerank(client, provider, documents=DOCS[:2])
        ready = client.get("/ready")
    assert refused.status_code == 502 and served.status_code == 200
    assert any(e["event"] == "hosted_account_refused" and e["status"] == 401 for e in logs)
    for secret in (WRONG, KEYS[provider]):
        assert secret not in refused.text and secret not in served.text and secret not in ready.text
        assert not any(secret in repr(e) for e in logs + STARTUP_LOGS)
    assert STARTUP_LOGS, "the models' start was not captured"


def test_key_from_a_file(client, fake):
    r = rerank(client, "cohere-file", documents=DOCS[:2])
    assert r.status_code == 200, r.text
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEYS['cohere']}"


def test_missing_key_fails_the_model_with_a_hint(client):
    r = rerank(client, "voyage-nokey")
    assert r.status_code == 503
    assert "RERANK_TEST_UNSET_VARIABLE" in r.json()["message"] and "api_key_file" in r.json()["message"]


def test_nvidia_logits_become_scores_by_sigmoid(client, fake):
    r = rerank(client, "nvidia", documents=DOCS[:2])
    (call,) = fake.requests
    assert call.body["query"] == {"text": Q}
    for x in r.json()["results"]:
        logit = math.log(fake_score(Q, DOCS[x["index"]]) / (1 - fake_score(Q, DOCS[x["index"]])))
        assert x["relevance_score"] == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-9)


@pytest.mark.parametrize("provider", NAMES)
def test_a_typo_in_a_provider_field_fails_at_load_with_its_path(provider, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'[[models]]\nname = "m"\nengine = "{provider}"\nmodel = "x"\nmax_documents_per_cal = 3\n')
    with pytest.raises(ConfigError) as info:
        load_settings(config, environ={})
    assert "models[0]" in str(info.value) and "max_documents_per_cal" in str(info.value)


def test_key_and_key_file_together_are_refused_at_load(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[[models]]\nname = "m"\nengine = "jina"\nmodel = "x"\napi_key = "k"\napi_key_file = "/k"\n')
    with pytest.raises(ConfigError, match="api_key_file"):
        load_settings(config, environ={})


def test_every_provider_has_a_fake():
    assert set(SPECS) == set(CONFIGS) and set(PROVIDERS) == set(CONFIGS.values())


def test_check_config_reports_a_missing_or_unreadable_key(tmp_path, monkeypatch):
    from gateway.launch.preflight import preflight

    monkeypatch.delenv("RERANK_TEST_UNSET_VARIABLE", raising=False)
    key = tmp_path / "key"
    key.write_text(KEYS["jina"])
    settings = Settings(
        models=(
            JinaEngineConfig(name="found", model="m", api_key_file=str(key)),
            JinaEngineConfig(name="absent", model="m", api_key_env="RERANK_TEST_UNSET_VARIABLE"),
            JinaEngineConfig(name="unreadable", model="m", api_key_file=str(tmp_path / "nowhere")),
        )
    )
    findings = [f.message for f in preflight(settings).findings if "key" in f.message]
    assert findings == [
        (
            "models[1] (absent): no API key found: set api_key, api_key_file or the environment variable "
            "RERANK_TEST_UNSET_VARIABLE"
        ),
        (
            "models[2] (unreadable): api_key_file: cannot read the key file (FileNotFoundError); check the path and "
            "its permissions"
        ),
    ]
    assert not any(KEYS["jina"] in f.message for f in preflight(settings).findings)


@pytest.mark.parametrize(
    ("fault", "served_by"),
    [
        (Fault(503, "overloaded"), "voyage"),  # retried, then the chain moves on
        (Fault(401, "invalid api token"), "voyage"),  # the target's account: the chain moves on
        (Fault(400, "invalid request: query must not be empty"), None),  # the request's own fault: back as it is
    ],
)
def test_hosted_providers_as_chain_targets(client, fake, fault, served_by):
    faults = [fault] * 3 if fault.status == 503 else [fault]  # a 503 is retried twice first
    fake.fail_next("cohere", *faults)
    r = rerank(client, "hosted-chain", documents=DOCS[:2])
    providers = [c.provider for c in fake.requests]
    if served_by is None:
        assert r.status_code == 422, r.text
        assert providers == ["cohere"]
        return
    assert r.status_code == 200, r.text
    assert r.headers["x-rerank-target"] == served_by
    assert providers == ["cohere"] * len(faults) + [served_by]


@pytest.mark.parametrize("provider", NAMES)
def test_the_fakes_are_strict(fake, provider):
    # What the gateway's calls are checked against: the fakes refuse what the providers refuse.
    spec, auth = SPECS[provider], {"authorization": f"Bearer {KEYS[provider]}"}
    path = f"/{provider}{spec.path}"
    good = EXPECTED_BODY[provider](DOCS[:2])

    def status(body, headers=auth):
        return fake.handle(path, headers, json.dumps(body).encode())[0]

    assert status(good) == 200
    assert status({**good, "documents_typo": 1}) == spec.invalid  # an unknown field
    assert status({**good, "query": 7} if provider != "nvidia" else {**good, "query": {"text": 7}}) == spec.invalid
    assert status({k: v for k, v in good.items() if k != "model"}) == spec.invalid
    assert status(EXPECTED_BODY[provider](DOCS[:1] * (MAX_DOCS + 1))) == spec.invalid  # over the document limit
    assert status(good, {"authorization": f"Bearer {WRONG}"}) == 401
    assert status(good, {}) == 401
    fake.clear()
