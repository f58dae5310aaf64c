"""Quotas over calendar days and months, in process: windows in a time zone (DST, year end),
the 429 that names the quota and its reset, and the config check of the time zone.

The shared (Redis, two replicas) case is tests/test_teams.py.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config.settings import ConfigError, load_settings
from gateway.errors import AuthError
from gateway.security.auth import generate_key, hash_key
from gateway.security.quotas import Calendar, QuotaRule, _days, quota_refusal
from schemas.config import ApiKeyConfig, AuthConfig, LimitsConfig, Settings, StaticEngineConfig

KEY, ADMIN = generate_key(), generate_key()


def test_day_and_month_windows_follow_the_time_zone_across_dst_and_year_end() -> None:
    berlin = Calendar("Europe/Berlin")
    # 2026-03-29 is the spring-forward day in Berlin: 23 hours long.
    day, reset = berlin.window("day", datetime(2026, 3, 28, 23, 30, tzinfo=UTC))  # 00:30 local on the 29th
    assert day == "2026-03-29"
    assert reset.isoformat() == "2026-03-30T00:00:00+02:00"
    assert reset - datetime(2026, 3, 28, 23, 0, tzinfo=UTC) == timedelta(hours=23)  # local midnight to midnight
    month, reset = berlin.window("month", datetime(2026, 12, 31, 23, 30, tzinfo=UTC))  # already 2027 in Berlin
    assert month == "2027-01" and reset.isoformat() == "2027-02-01T00:00:00+01:00"
    month, reset = Calendar("UTC").window("month", datetime(2026, 12, 31, 23, 30, tzinfo=UTC))
    assert month == "2026-12" and reset.isoformat() == "2027-01-01T00:00:00+00:00"


def test_retry_after_counts_real_seconds_across_a_dst_change() -> None:
    # 00:30 local on Berlin's 23-hour spring-forward day: the day resets in 22.5 real hours. Two
    # datetimes in the same ZoneInfo subtract as local times (23.5 h): Retry-After must not.
    berlin = Calendar("Europe/Berlin")
    now = datetime(2026, 3, 28, 23, 30, tzinfo=UTC).astimezone(berlin.zone)
    _, reset = berlin.window("day", now)
    rule = QuotaRule(metric="tokens", period="day", limit=10)
    refusal = quota_refusal(ApiKeyConfig(id="team", hash=hash_key(KEY), models=("*",)), rule, 10, 5, reset, now)
    assert refusal.headers["Retry-After"] == str(int(22.5 * 3600))


def test_usage_days_stop_at_the_range_end_even_at_the_last_date() -> None:
    # Stepping one day past 9999-12-31 overflowed date.max: the usage route answered 500.
    assert list(_days(date(9999, 12, 30), date.max)) == [date(9999, 12, 30), date.max]
    assert list(_days(date(2026, 12, 4), date(2026, 12, 3))) == []


def test_a_bad_time_zone_fails_at_load_with_the_field_path(tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[limits]\nquota_timezone = "Mars/Olympus"\n[[models]]\nname = "m"\nengine = "static"\n')
    with pytest.raises(ConfigError, match=r"limits.*quota_timezone.*Mars/Olympus"):
        load_settings(config, environ={})


def _app(clock: list[datetime]):
    keys = (
        ApiKeyConfig(id="team", hash=hash_key(KEY), models=("*",), tokens_per_day=20, search_units_per_month=3),
        ApiKeyConfig(id="root", hash=hash_key(ADMIN), models=("*",), admin=True),
    )
    settings = Settings(
        limits=LimitsConfig(quota_timezone="America/New_York"),
        auth=AuthConfig(keys=keys),
        models=(StaticEngineConfig(name="m"),),
    )
    app = create_app(settings, configure_logs=False)
    app.state.access.limiter.calendar.clock = lambda: clock[0]
    return app


def test_daily_token_quota_refuses_with_its_name_and_reset_then_resets_at_local_midnight() -> None:
    clock = [datetime(2026, 7, 1, 3, 0, tzinfo=UTC)]  # 23:00 on June 30th in New York (EDT)
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "m", "query": "q", "documents": ["one two three four", "five"]}  # 7 tokens, 1 search unit
    with TestClient(_app(clock)) as client:
        assert client.post("/v1/rerank", json=body, headers=headers).status_code == 200
        assert client.post("/v1/rerank", json=body, headers=headers).status_code == 200
        # 14 used of 20: the next 7 would pass the quota, so it is refused and not charged.
        refused = client.post("/v1/rerank", json=body, headers=headers)
        assert refused.status_code == 429, refused.text
        message = refused.json()["message"]
        assert "tokens_per_day = 20" in message and "needs 7 tokens" in message and "6 left" in message
        assert "resets at 2026-07-01T00:00:00-04:00" in message
        assert refused.headers["retry-after"] == "3600" and refused.headers["x-quota-name"] == "tokens_per_day"
        # The refused request's tokens are in no count: not the quota's, not /metrics'.
        assert 'rerank_tokens_total{key="team",model="m"} 14.0' in client.get("/metrics").text
        # A smaller request still fits: the refused one was not charged.
        small = {"model": "m", "query": "q", "documents": ["a"]}  # 1 + 1 = 2 tokens
        assert client.post("/v1/rerank", json=small, headers=headers).status_code == 200
        status = client.get("/admin/v1/keys/team/quota", headers={"X-API-Key": ADMIN}).json()
        by_name = {q["quota"]: q for q in status["quotas"]}
        assert by_name["tokens_per_day"]["used"] == 16 and by_name["search_units_per_month"]["used"] == 3
        # The monthly search-unit quota (3) is used up now: refused up front, before any work.
        month = client.post("/v1/rerank", json=small, headers=headers)
        assert month.status_code == 429 and "search_units_per_month = 3" in month.json()["message"]
        assert "resets at 2026-07-01T00:00:00-04:00" in month.json()["message"]
        # Local midnight: a new day and a new month in New York.
        clock[0] = datetime(2026, 7, 1, 4, 0, 1, tzinfo=UTC)
        assert client.post("/v1/rerank", json=body, headers=headers).status_code == 200
        usage = client.get("/admin/v1/usage?start=2026-06-30&end=2026-06-30", headers={"X-API-Key": ADMIN}).json()
        assert usage["data"] == [
            {"key": "team", "model": "m", "requests": 3, "documents": 5, "tokens": 16, "search_units": 3}
        ]
        # Without limits.redis_url there is no shared key store: key changes are refused, plainly.
        created = client.post("/admin/v1/keys", json={"id": "x", "models": ["*"]}, headers={"X-API-Key": ADMIN})
        assert created.status_code == 501 and "limits.redis_url" in created.json()["message"]
        # A non-admin key never reaches the admin API.
        assert client.get("/admin/v1/keys", headers=headers).status_code == 403
        assert client.get("/admin/v1/keys").status_code == 401


def test_a_request_its_quota_refused_is_not_counted_against_tpm_either() -> None:
    keys = (ApiKeyConfig(id="team", hash=hash_key(KEY), models=("*",), tokens_per_day=20, tpm=1000),)
    settings = Settings(auth=AuthConfig(keys=keys), models=(StaticEngineConfig(name="m"),))
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "m", "query": "q", "documents": ["one two three four", "five"]}  # 7 tokens
    with TestClient(create_app(settings, configure_logs=False)) as client:
        for _ in range(2):
            assert client.post("/v1/rerank", json=body, headers=headers).status_code == 200
        assert client.post("/v1/rerank", json=body, headers=headers).status_code == 429  # scored, then refused
        small = client.post("/v1/rerank", json={"model": "m", "query": "q", "documents": ["a"]}, headers=headers)
        # 1000 - 14 (the two answers) - 2 (this one): the refused request's 7 tokens count nowhere.
        assert small.status_code == 200 and small.headers["x-ratelimit-remaining-tokens"] == "984"


def test_keys_create_writes_quotas_and_the_admin_flag_as_valid_toml(capsys: pytest.CaptureFixture[str]) -> None:
    import msgspec

    from gateway.cli import main

    argv = [
        "keys",
        "create",
        "--name",
        "ops",
        "--models",
        "*",
        "--tokens-per-month",
        "9",
        "--search-units-per-day",
        "3",
        "--admin",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    key, _, entry = out.partition("\n\n")
    parsed = msgspec.toml.decode(entry.encode())["auth"]["keys"][0]
    config = msgspec.convert(parsed, ApiKeyConfig, strict=True)
    assert (config.tokens_per_month, config.search_units_per_day, config.admin) == (9, 3, True)
    assert config.hash == hash_key(key.strip()) and config.tokens_per_day is None


def _unreachable(failure: str) -> Settings:
    from tests.conftest import free_port

    key = ApiKeyConfig(id="team", hash=hash_key(KEY), models=("*",), tokens_per_day=20)
    return Settings(
        limits=LimitsConfig(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_failure=failure),
        auth=AuthConfig(keys=(key,)),
        models=(StaticEngineConfig(name="m"),),
    )


def test_redis_down_follows_redis_failure_for_quotas_as_for_rate_limits() -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "m", "query": "q", "documents": ["one two three four", "five"]}  # 7 tokens
    with TestClient(create_app(_unreachable("closed"), configure_logs=False)) as client:
        refused = client.post("/v1/rerank", json=body, headers=headers)
        assert refused.status_code == 503 and "limit store unreachable" in refused.json()["message"]
        assert refused.headers["retry-after"] == "5"
    with TestClient(create_app(_unreachable("open"), configure_logs=False)) as client:
        # This process's own counters: 7 + 7 fit in 20, the third does not.
        assert [client.post("/v1/rerank", json=body, headers=headers).status_code for _ in range(3)] == [200, 200, 429]


def test_the_admin_api_answers_503_not_500_while_the_shared_store_is_down() -> None:
    settings = _unreachable("closed")
    admin = ApiKeyConfig(id="root", hash=hash_key(ADMIN), models=("*",), admin=True)
    settings = Settings(limits=settings.limits, auth=AuthConfig(keys=(admin,)), models=settings.models)
    headers = {"X-API-Key": ADMIN}
    with TestClient(create_app(settings, configure_logs=False)) as client:
        for response in (
            client.get("/admin/v1/keys", headers=headers),
            client.post("/admin/v1/keys", json={"id": "x", "models": ["*"]}, headers=headers),
        ):
            assert response.status_code == 503, response.text
            assert "shared key store" in response.json()["message"] and response.headers["retry-after"] == "5"
        usage = client.get("/admin/v1/usage?start=2026-12-01&end=2026-12-02", headers=headers)
        assert usage.status_code == 503 and "limit store unreachable" in usage.json()["message"]


def test_a_file_key_wins_over_an_admin_key_with_its_id_or_hash() -> None:
    from gateway.http.access import AccessControl

    other = generate_key()
    file_key = ApiKeyConfig(id="team", hash=hash_key(KEY), models=("*",))
    control = AccessControl(Settings(auth=AuthConfig(keys=(file_key,)), models=(StaticEngineConfig(name="m"),)))
    control._admin_keys = (  # what the shared store holds (gateway.security.admin)
        ApiKeyConfig(id="team", hash=hash_key(other), models=("*",), admin=True),  # the file's id
        ApiKeyConfig(id="copy", hash=hash_key(KEY), models=("*",), admin=True),  # the file's hash
        ApiKeyConfig(id="ads", hash=hash_key(ADMIN), models=("m",)),
    )
    control.keys = control._merged(control._settings.auth.keys)
    assert [(k.id, k.admin) for k in control.keys.keys] == [("team", False), ("ads", False)]
    assert [(i.id, i.source) for i in control.key_infos()] == [("team", "file"), ("ads", "admin")]
    with pytest.raises(AuthError):  # the shadowed admin key's secret is not a key at all
        control.keys.authenticate([(b"x-api-key", other.encode())])
