"""API keys through the HTTP API: 401 / 403 / 429 and their headers, scopes, expiry, usage metrics.

In-process (Litestar TestClient, ``static`` engine, in-memory limits), plus real gateway
processes where the behaviour is the process's: refusing a public bind without keys, the
``keys create`` command end to end, and logs that never carry key material.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config.settings import ConfigError
from gateway.security.auth import check_exposure, generate_key, hash_key, presented_key
from schemas.config import ApiKeyConfig, AuthConfig, ServerConfig, Settings, StaticEngineConfig
from tests.conftest import ROOT

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/v1/rerank", "/v2/rerank", "/v1/v2/rerank")
KEYS = {name: generate_key() for name in ("all", "team", "priv", "expired", "rpm", "tpm", "conc", "future")}
MODELS = (
    StaticEngineConfig(name="team-small", aliases=("small",)),
    StaticEngineConfig(name="team-large", aliases=("large", "rerank-v3.5")),
    StaticEngineConfig(name="private", aliases=("team-private",)),
    StaticEngineConfig(name="slow", delay_s=0.5),
)


def _key(name: str, models: tuple[str, ...] = ("*",), **kw) -> ApiKeyConfig:
    return ApiKeyConfig(id=f"key-{name}", hash=hash_key(KEYS[name]), models=models, **kw)


def _settings() -> Settings:
    past = datetime.now(UTC) - timedelta(minutes=1)
    future = datetime.now(UTC).replace(tzinfo=None) + timedelta(days=1)  # naive = UTC
    return Settings(
        models=MODELS,
        auth=AuthConfig(
            keys=(
                _key("all"),
                # A glob that matches "team-small" and "team-large" but not "private", whose
                # alias "team-private" would match if aliases were checked instead of names.
                _key("team", ("team-*",)),
                _key("priv", ("private",)),
                _key("expired", expires_at=past),
                _key("future", ("team-small",), expires_at=future),
                _key("rpm", rpm=3),
                _key("tpm", tpm=10),
                _key("conc", max_concurrent=1),
            )
        ),
    )


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(_settings(), configure_logs=False)) as c:
        yield c


def bearer(name: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {KEYS[name]}"}


def body(model: str | None = "team-small", docs=("a b", "c")) -> dict:
    out = {"query": "q", "documents": list(docs)}
    if model is not None:
        out["model"] = model
    return out


def assert_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    data = resp.json()
    assert set(data) == {"message", "id", "detail"} and data["id"] == resp.headers["x-request-id"]
    return data


@pytest.mark.parametrize("path", RERANK_PATHS)
def test_missing_key_is_401_on_every_rerank_route(client, path):
    data = assert_error(client.post(path, json=body()), 401)
    assert "Authorization: Bearer" in data["message"]
    assert client.post(path, json=body()).headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer rk-not-a-key"},
        {"X-API-Key": "rk-not-a-key"},
        {"Authorization": "Bearer"},  # scheme without a token
        {"Authorization": f"Basic {KEYS['all']}"},  # the right key under the wrong scheme
        {"Authorization": f"Bearer {KEYS['all']}x"},
    ],
)
def test_invalid_key_is_401(client, headers):
    resp = client.post("/v1/rerank", json=body(), headers=headers)
    data = assert_error(resp, 401)
    assert KEYS["all"] not in resp.text and "rk-not-a-key" not in data["message"]


def test_unauthenticated_request_with_bad_body_is_401_not_422(client):
    resp = client.post("/v1/rerank", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_error(resp, 401)


def test_expired_key_is_401_and_future_expiry_is_accepted(client):
    resp = client.post("/v1/rerank", json=body(), headers=bearer("expired"))
    data = assert_error(resp, 401)
    assert "expired" in data["message"] and 'error="invalid_token"' in resp.headers["www-authenticate"]
    assert client.post("/v1/rerank", json=body(), headers=bearer("future")).status_code == 200


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_bearer_scheme_is_case_insensitive(client, scheme):
    assert client.post("/v1/rerank", json=body(), headers=bearer("all", scheme)).status_code == 200


def test_x_api_key_header(client):
    resp = client.post("/v2/rerank", json=body(), headers={"X-API-Key": KEYS["all"]})
    assert resp.status_code == 200 and resp.json()["model"] == "team-small"


@pytest.mark.parametrize("path", RERANK_PATHS)
@pytest.mark.parametrize("model", ["private", "team-private"])
def test_scoped_key_cannot_reach_another_model_by_any_route_or_alias(client, path, model):
    data = assert_error(client.post(path, json=body(model), headers=bearer("team")), 403)
    assert data["message"] == "API key 'key-team' is not allowed to use model 'private'"


@pytest.mark.parametrize("path", RERANK_PATHS)
@pytest.mark.parametrize("model", ["team-small", "small", "large", "rerank-v3.5"])
def test_scoped_key_reaches_its_models_by_name_and_alias(client, path, model):
    resp = client.post(path, json=body(model), headers=bearer("team"))
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] in {"team-small", "team-large"}


def test_scope_applies_to_the_default_model(client):
    # /v1/rerank without a model serves the first model, "team-small": in the team key's
    # scope, not in that of a key scoped to "private" alone.
    assert client.post("/v1/rerank", json=body(None), headers=bearer("team")).status_code == 200
    data = assert_error(client.post("/v1/rerank", json=body(None), headers=bearer("priv")), 403)
    assert "'team-small'" in data["message"]
    assert client.post("/v1/rerank", json=body("team-private"), headers=bearer("priv")).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/ready", "/v1/models", "/models", "/metrics", "/schema/openapi.json"])
def test_open_paths_need_no_key(client, path):
    assert client.get(path).status_code == 200


def test_rpm_limit_headers_and_429(client):
    seen = []
    for expected_remaining in (2, 1, 0):
        resp = client.post("/v1/rerank", json=body(), headers=bearer("rpm"))
        assert resp.status_code == 200
        assert resp.headers["x-ratelimit-limit"] == "3"
        seen.append(int(resp.headers["x-ratelimit-remaining"]))
        assert 1 <= int(resp.headers["x-ratelimit-reset"]) <= 60
    assert seen == [2, 1, 0]
    resp = client.post("/v1/rerank", json=body(), headers=bearer("rpm"))
    data = assert_error(resp, 429)
    assert "3 requests per minute" in data["message"]
    assert 1 <= int(resp.headers["retry-after"]) <= 60
    assert resp.headers["x-ratelimit-limit"] == "3" and resp.headers["x-ratelimit-remaining"] == "0"
    assert int(resp.headers["x-ratelimit-reset"]) == int(resp.headers["retry-after"])
    # A key without limits gets no X-RateLimit headers.
    assert "x-ratelimit-limit" not in client.post("/v1/rerank", json=body(), headers=bearer("all")).headers


def test_failed_requests_count_toward_rpm():
    settings = Settings(models=MODELS, auth=AuthConfig(keys=(_key("rpm", ("team-*",), rpm=3),)))
    with TestClient(create_app(settings, configure_logs=False)) as c:
        assert_error(c.post("/v1/rerank", json={"query": "q"}, headers=bearer("rpm")), 422)  # no documents
        assert_error(c.post("/v1/rerank", json=body("private"), headers=bearer("rpm")), 403)
        assert_error(c.post("/v1/rerank", json=body("nope"), headers=bearer("rpm")), 404)
        assert_error(c.post("/v1/rerank", json=body(), headers=bearer("rpm")), 429)
        # The refused request itself did not use a slot: the window is still exactly full.
        assert_error(c.post("/v1/rerank", json=body(), headers=bearer("rpm")), 429)
        metrics = c.get("/metrics").text
    assert 'rerank_rate_limited_total{key="key-rpm",limit="rpm"} 2.0' in metrics
    assert 'rerank_requests_total{key="key-rpm",model="private",status="403"} 1.0' in metrics
    assert 'rerank_requests_total{key="key-rpm",model="-",status="404"} 1.0' in metrics


def test_tpm_admits_while_budget_is_left_and_charges_engine_tokens(client):
    # The static engine counts whitespace words: query words x documents + document words.
    # 1 x 2 + (4 + 1) = 7 tokens of the 10 per minute.
    docs = ("one two three four", "five")
    resp = client.post("/v1/rerank", json=body(docs=docs), headers=bearer("tpm"))
    assert resp.status_code == 200 and resp.json()["meta"]["tokens"]["input_tokens"] == 7
    assert resp.headers["x-ratelimit-limit-tokens"] == "10"
    assert resp.headers["x-ratelimit-remaining-tokens"] == "3"
    assert resp.headers["x-ratelimit-limit"] == "10"  # no rpm: the plain headers are the token window
    assert 55 <= int(resp.headers["x-ratelimit-reset-tokens"]) <= 60
    # 3 tokens left: admitted, and its 7 tokens are charged in full (overshoot included).
    assert client.post("/v1/rerank", json=body(docs=docs), headers=bearer("tpm")).status_code == 200
    resp = client.post("/v1/rerank", json=body(docs=("x",)), headers=bearer("tpm"))
    data = assert_error(resp, 429)
    assert "10 tokens per minute" in data["message"]
    assert resp.headers["x-ratelimit-remaining"] == "0" and int(resp.headers["retry-after"]) >= 1


def test_max_concurrent_is_429_while_a_request_runs(client):
    def call(_: int) -> httpx.Response:
        return client.post("/v1/rerank", json=body("slow"), headers=bearer("conc"))

    with ThreadPoolExecutor(4) as pool:
        statuses = sorted(r.status_code for r in pool.map(call, range(4)))
    assert statuses[0] == 200 and 429 in statuses, statuses
    # The slot was released: a new request goes through.
    assert call(0).status_code == 200


def wait_in_flight(get, model: str) -> None:
    """Until ``model`` has a request in flight (per /ready), so the key's slot is surely taken."""
    deadline = time.monotonic() + 10
    while not any(m["name"] == model and m["in_flight"] for m in get("/ready").json()["models"]):
        assert time.monotonic() < deadline, f"no request of {model!r} in flight"
        time.sleep(0.01)


def test_max_concurrent_429_headers(client):
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(client.post, "/v1/rerank", json=body("slow"), headers=bearer("conc"))
        wait_in_flight(client.get, "slow")
        refused = client.post("/v1/rerank", json=body("team-small"), headers=bearer("conc"))
        assert running.result().status_code == 200
    data = assert_error(refused, 429)
    assert "max_concurrent" in data["message"]
    assert refused.headers["retry-after"] == "1" and refused.headers["x-ratelimit-limit"] == "1"
    assert refused.headers["x-ratelimit-remaining"] == "0"


def test_usage_metrics_per_key_and_model(client):
    for model in ("small", "team-small", "large"):
        assert client.post("/v1/rerank", json=body(model, ("a b c", "d")), headers=bearer("team")).status_code == 200
    text = client.get("/metrics").text
    counters = dict(re.findall(r'^(rerank_\w+\{key="key-team",model="team-small"[^}]*\}) (\S+)$', text, re.MULTILINE))
    assert float(counters['rerank_requests_total{key="key-team",model="team-small",status="200"}']) >= 2
    docs = float(counters['rerank_documents_total{key="key-team",model="team-small"}'])
    tokens = float(counters['rerank_tokens_total{key="key-team",model="team-small"}'])
    units = float(counters['rerank_search_units_total{key="key-team",model="team-small"}'])
    assert docs >= 4 and units >= 2 and tokens >= 2 * (2 + 4)
    assert 'model="team-large"' in text and 'key="unauthenticated"' in text
    for key in KEYS.values():
        assert key not in text and hash_key(key).split(":")[1] not in text


def test_gateway_without_keys_is_open_and_counts_anonymous():
    with TestClient(create_app(Settings(models=MODELS), configure_logs=False)) as c:
        resp = c.post("/rerank", json=body("large"))
        assert resp.status_code == 200 and "x-ratelimit-limit" not in resp.headers
        assert 'rerank_requests_total{key="anonymous",model="team-large",status="200"} 1.0' in c.get("/metrics").text


def test_duplicate_key_ids_or_hashes_are_config_errors():
    twice = (_key("all"), _key("all"))
    with pytest.raises(ConfigError, match="used twice"):
        create_app(Settings(models=MODELS, auth=AuthConfig(keys=twice)), configure_logs=False)
    same_hash = (_key("all"), ApiKeyConfig(id="other", hash=hash_key(KEYS["all"]), models=("*",)))
    with pytest.raises(ConfigError, match="same hash") as info:
        create_app(Settings(models=MODELS, auth=AuthConfig(keys=same_hash)), configure_logs=False)
    assert hash_key(KEYS["all"]) not in str(info.value)


def test_presented_key_prefers_bearer_and_ignores_other_schemes():
    assert presented_key([(b"x-api-key", b"k2"), (b"authorization", b"Bearer k1")]) == "k1"
    assert presented_key([(b"authorization", b"Basic abc"), (b"x-api-key", b" k2 ")]) == "k2"
    assert presented_key([(b"authorization", b"Basic abc")]) is None


@pytest.mark.parametrize(
    ("host", "auth", "refused"),
    [
        ("127.0.0.1", AuthConfig(), False),
        ("::1", AuthConfig(), False),
        ("localhost", AuthConfig(), False),
        ("0.0.0.0", AuthConfig(), True),
        ("::", AuthConfig(), True),
        ("gateway.internal", AuthConfig(), True),
        ("0.0.0.0", AuthConfig(open=True), False),
        ("0.0.0.0", AuthConfig(keys=(_key("all"),)), False),
    ],
)
def test_exposure_rule(host, auth, refused):
    settings = Settings(server=ServerConfig(host=host), auth=auth, models=MODELS)
    if refused:
        with pytest.raises(ConfigError, match="auth.open = true"):
            check_exposure(settings)
    else:
        check_exposure(settings)


@pytest.mark.slow
def test_serve_refuses_public_bind_without_keys(tmp_path):
    # Refused before binding anything: the process never listens on 0.0.0.0.
    config = tmp_path / "public.toml"
    config.write_text('[server]\nhost = "0.0.0.0"\n[[models]]\nname = "m"\nengine = "static"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to serve on 0.0.0.0 without API keys" in lines[0], proc.stderr


@pytest.mark.slow
def test_keys_create_end_to_end_and_logs_hold_no_key_material(gateway_server):
    created = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "create", "--name", "ci", "--models", "m*", "--rpm", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key, _, entry = created.stdout.partition("\n\n")
    assert key.startswith("rk-") and len(key) > 40 and key not in created.stderr
    digest = hash_key(key).split(":")[1]
    assert f'hash = "sha256:{digest}"' in entry and 'models = ["m*"]' in entry and "rpm = 2" in entry
    assert key not in entry
    other = generate_key()
    config = (
        '[logging]\nlevel = "DEBUG"\n'
        '[[models]]\nname = "m1"\nengine = "static"\n[[models]]\nname = "x1"\nengine = "static"\n' + entry
    )
    server = gateway_server(config)
    url = f"{server.url}/v1/rerank"
    doc = {"query": "q", "documents": ["a"], "model": "m1"}
    statuses = [
        httpx.post(url, json=doc, headers={"Authorization": f"Bearer {key}"}).status_code,
        httpx.post(url, json={**doc, "model": "x1"}, headers={"X-API-Key": key}).status_code,
        httpx.post(url, json=doc, headers={"Authorization": f"bearer {key}"}).status_code,
        httpx.post(url, json=doc, headers={"Authorization": f"Bearer {other}"}).status_code,
        httpx.post(url, json=doc, headers={"X-API-Key": other}).status_code,
        httpx.post(url, json=doc, headers={"Authorization": f"Token {key}"}).status_code,
        httpx.post(url, json=doc, headers={"Authorization": f"Bearer {key[:-1]}"}).status_code,
    ]
    assert statuses == [200, 403, 429, 401, 401, 401, 401]
    metrics = httpx.get(f"{server.url}/metrics").text
    server.stop()  # flushes every log line
    logs = server.log_path.read_text(errors="replace")
    assert '"key_id":"ci"' in logs and logs.count('"event":"request"') >= len(statuses)
    for secret in (key, other, key[:-1], digest, hash_key(other).split(":")[1], key[3:], other[3:]):
        assert secret not in logs
        assert secret not in metrics
    # Not even a fragment long enough to narrow a guess (16 characters = 96 bits of the key).
    for i in range(3, len(key) - 16):
        assert key[i : i + 16] not in logs


def test_openapi_declares_bearer_on_rerank_routes_only(client):
    paths = client.get("/schema/openapi.json").json()["paths"]
    for path in RERANK_PATHS:
        assert paths[path]["post"]["security"] == [{"bearer": []}]
    assert "security" not in paths["/health"]["get"] and "security" not in paths["/v1/models"]["get"]
