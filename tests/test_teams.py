"""Operating for teams across replicas: two real gateway processes sharing one real redis-server.

- a daily quota is enforced exactly under concurrent load spread over both replicas, and the
  429 names the quota and its reset time;
- the admin API creates, lists, changes and revokes keys and reads usage; a key revoked on one
  replica is refused by the other within a second;
- no response (other than the one that creates a key) and no log line ever contains a key or
  its hash: everything the test received and both processes wrote is searched.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import httpx
import pytest

from gateway.security.auth import generate_key, hash_key
from tests.conftest import ServerProcess
from tests.test_ratelimit_redis import redis_url  # noqa: F401 -- the module's redis-server fixture

pytestmark = pytest.mark.slow

ROOT, DAILY, TOKENS, PLAIN = (generate_key() for _ in range(4))
SEARCH_UNITS_PER_DAY = 12
TOKENS_PER_DAY = 50  # 7 tokens a request: exactly 7 fit
RECEIVED: list[str] = []  # every response body and header the tests got (but key creation's)


def _zone() -> str:
    """A zone whose local time is far from midnight, so no window turns over during the test."""
    for zone in ("UTC", "Asia/Tokyo", "America/New_York"):
        if 1 <= datetime.now(ZoneInfo(zone)).hour <= 22:
            return zone
    raise AssertionError("unreachable: these zones are 9 and 5 hours apart")


ZONE = _zone()


def _config(redis: str) -> str:
    return (
        f'[limits]\nredis_url = "{redis}"\nredis_timeout_s = 30\nquota_timezone = "{ZONE}"\n'
        "[auth]\nsync_interval_s = 0.25\n"
        '[[models]]\nname = "m"\nengine = "static"\ndelay_s = 0.02\n'
        '[[models]]\nname = "other"\nengine = "static"\n'
        f'[[auth.keys]]\nid = "root"\nhash = "{hash_key(ROOT)}"\nmodels = ["*"]\nadmin = true\n'
        f'[[auth.keys]]\nid = "daily"\nhash = "{hash_key(DAILY)}"\nmodels = ["*"]\n'
        f"search_units_per_day = {SEARCH_UNITS_PER_DAY}\n"
        f'[[auth.keys]]\nid = "tokens"\nhash = "{hash_key(TOKENS)}"\nmodels = ["*"]\ntokens_per_day = {TOKENS_PER_DAY}\n'
        f'[[auth.keys]]\nid = "plain"\nhash = "{hash_key(PLAIN)}"\nmodels = ["*"]\n'
    )


@pytest.fixture(scope="module")
def replicas(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    tmp = tmp_path_factory.mktemp("teams")
    servers = [ServerProcess(_config(redis_url), tmp) for _ in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


def _keep(resp: httpx.Response) -> httpx.Response:
    RECEIVED.append(resp.text)
    RECEIVED.extend(f"{k}: {v}" for k, v in resp.headers.items())
    return resp


def _body(docs: tuple[str, ...] = ("one two three four", "five")) -> dict:
    return {"model": "m", "query": "q", "documents": list(docs)}


async def _burst(urls: list[str], key: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        calls = [
            client.post(f"{urls[i % 2]}/v1/rerank", json=_body(), headers={"Authorization": f"Bearer {key}"})
            for i in range(n)
        ]
        return await asyncio.gather(*calls)


def _next_midnight() -> str:
    local = datetime.now(ZoneInfo(ZONE))
    nxt = local.date() + timedelta(days=1)
    return datetime(nxt.year, nxt.month, nxt.day, tzinfo=ZoneInfo(ZONE)).isoformat()


def test_daily_quotas_are_exact_across_two_replicas_under_concurrent_load(replicas) -> None:
    urls = [s.url for s in replicas]
    admin = {"Authorization": f"Bearer {ROOT}"}
    # Search units: one a request, 4x the quota at once over both replicas.
    responses = [_keep(r) for r in asyncio.run(_burst(urls, DAILY, 4 * SEARCH_UNITS_PER_DAY))]
    assert Counter(r.status_code for r in responses) == {200: SEARCH_UNITS_PER_DAY, 429: 3 * SEARCH_UNITS_PER_DAY}
    for resp in responses:
        if resp.status_code == 429:
            message = resp.json()["message"]
            assert f"search_units_per_day = {SEARCH_UNITS_PER_DAY}" in message, message
            assert f"resets at {_next_midnight()}" in message, message
            assert resp.headers["x-quota-reset"] == _next_midnight()
            retry = int(resp.headers["retry-after"])
            assert 1 <= retry <= 25 * 3600
    # Tokens are counted after scoring: 7 per request, 50 a day -> exactly 7 of 20 answered.
    responses = [_keep(r) for r in asyncio.run(_burst(urls, TOKENS, 20))]
    assert Counter(r.status_code for r in responses) == {200: 7, 429: 13}
    assert all("tokens_per_day = 50" in r.json()["message"] for r in responses if r.status_code == 429)
    # Usage so far, read on either replica: exactly the quota, never past it.
    quota = _keep(httpx.get(f"{urls[1]}/admin/v1/keys/tokens/quota", headers=admin)).json()
    assert quota["timezone"] == ZONE
    assert quota["quotas"] == [
        {"quota": "tokens_per_day", "limit": 50, "used": 49, "remaining": 1, "resets_at": _next_midnight()}
    ]
    usage = _keep(httpx.get(f"{urls[0]}/admin/v1/usage", params={"key": "daily"}, headers=admin)).json()
    assert usage["data"] == [
        {"key": "daily", "model": "m", "requests": 12, "documents": 24, "tokens": 84, "search_units": 12}
    ]


def _until(check, timeout: float, what: str) -> float:
    """Poll ``check`` every 20 ms until true; the seconds it took (bounded by ``timeout``)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, what
        time.sleep(0.02)
    return time.monotonic() - started


def _rerank(url: str, key: str, model: str = "m") -> int:
    body = {**_body(("a",)), "model": model}
    return _keep(httpx.post(f"{url}/v2/rerank", json=body, headers={"X-API-Key": key})).status_code


def test_admin_api_changes_reach_the_other_replica_and_revoked_keys_are_refused_within_a_second(replicas) -> None:
    a, b = (s.url for s in replicas)
    admin = {"Authorization": f"Bearer {ROOT}"}
    # Only an admin key reaches the admin API.
    assert _keep(httpx.get(f"{a}/admin/v1/keys", headers={"X-API-Key": PLAIN})).status_code == 403
    assert _keep(httpx.get(f"{a}/admin/v1/keys")).status_code == 401
    body = {"id": "team-x", "models": ["m"], "rpm": 100, "tokens_per_month": 1000}
    created = httpx.post(f"{a}/admin/v1/keys", json=body, headers=admin)  # the one answer with a secret
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    assert secret.startswith("rk-") and created.json()["key"]["tokens_per_month"] == 1000
    assert "hash" not in created.text and hash_key(secret)[7:] not in created.text
    _until(lambda: _rerank(b, secret) == 200, 1.0, "the new key works on the other replica")
    again = _keep(httpx.post(f"{b}/admin/v1/keys", json=body, headers=admin))
    assert again.status_code == 409
    # Listed on either replica, with its source, never a hash or a secret.
    listed = _keep(httpx.get(f"{b}/admin/v1/keys", headers=admin)).json()["data"]
    assert {k["id"]: k["source"] for k in listed} == {
        "root": "file",
        "daily": "file",
        "tokens": "file",
        "plain": "file",
        "team-x": "admin",
    }
    # The file owns its keys.
    assert _keep(httpx.delete(f"{a}/admin/v1/keys/plain", headers=admin)).status_code == 409
    assert _keep(httpx.delete(f"{a}/admin/v1/keys/nobody", headers=admin)).status_code == 404
    assert _keep(httpx.patch(f"{a}/admin/v1/keys/team-x", json={"rpm": 0}, headers=admin)).status_code == 422
    # A change of scope on A is enforced by B.
    changed = _keep(httpx.patch(f"{a}/admin/v1/keys/team-x", json={"models": ["other"], "rpm": None}, headers=admin))
    assert changed.status_code == 200 and changed.json()["models"] == ["other"] and changed.json()["rpm"] is None
    _until(lambda: _rerank(b, secret) == 403, 1.0, "the narrowed scope reaches the other replica")
    assert _rerank(b, secret, "other") == 200
    # Revoked on A: refused by B within a second of the answer.
    assert _keep(httpx.delete(f"{a}/admin/v1/keys/team-x", headers=admin)).status_code == 204
    took = _until(lambda: _rerank(b, secret, "other") == 401, 1.0, "a revoked key is refused by the other replica")
    assert took < 1.0
    usage = _keep(httpx.get(f"{b}/admin/v1/usage", params={"key": "team-x"}, headers=admin)).json()["data"]
    # Its answered requests per model (how many of the polls above got 200 before a change landed varies).
    assert [u["model"] for u in usage] == ["m", "other"] and all(u["requests"] >= 1 for u in usage)
    # Every change left one audit line on A: who, what, never the secret.
    audit = [line for line in replicas[0].output().splitlines() if '"admin_audit"' in line]
    assert len(audit) == 3 and all('"actor": "root"' in line or '"actor":"root"' in line for line in audit), audit
    assert [a for line in audit for a in ("create", "change", "revoke") if f'"{a}"' in line] == [
        "create",
        "change",
        "revoke",
    ]
    _no_secrets(replicas, [ROOT, DAILY, TOKENS, PLAIN, secret])


def _no_secrets(replicas: list[ServerProcess], secrets: list[str]) -> None:
    written = "\n".join(s.output() for s in replicas) + "\n".join(RECEIVED)
    assert "admin_audit" in written and "request" in written  # the logs are really there
    for secret in secrets:
        assert secret not in written
        assert hash_key(secret)[len("sha256:") :] not in written
