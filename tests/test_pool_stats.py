"""``/ready`` shows each pool replica's counters, and never the credentials a replica URL holds.

``/ready`` needs no key (tests/test_auth.py), and a replica URL may carry a user and password
(``http://user:secret@host:8000``): ``engine_stats`` and the pool's log lines show it with the
userinfo as ``***`` (a query string, which would also go, is refused at load: the pool appends
its API's path to each URL).

Real loopback upstreams (tests/test_pool_not_a_reranker.RefusingUpstream): a replica serving
another model (404, /health 200), reached through a URL with credentials, and a good one.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
import structlog
from litestar.testing import TestClient

from adapters.base import ScoreJob
from adapters.upstreams.pool import PoolEngine
from adapters.upstreams.replicas import redact_url
from gateway.app import create_app
from schemas.config import PoolEngineConfig, Settings
from tests.loopback import wait_loaded
from tests.test_pool_backoff import MODEL, Clock, _query_preferring
from tests.test_pool_misconfigured_failover import GOOD
from tests.test_pool_not_a_reranker import RefusingUpstream
from tests.test_pool_wrong_model import VLLM_404

SECRETS = ("alice", "s3cr3t-pw")


@pytest.fixture
def pair():
    """(bad URL with credentials, good URL), both served by loopback upstreams."""
    bad, good = RefusingUpstream(), RefusingUpstream()
    bad.status, bad.body = 404, VLLM_404
    good.status, good.body = 200, GOOD
    port = bad.url.rpartition(":")[2]
    yield f"http://alice:s3cr3t-pw@127.0.0.1:{port}", good.url
    bad.close()
    good.close()


def _config(urls: tuple[str, ...]) -> PoolEngineConfig:
    return PoolEngineConfig(
        name="pool", protocol="vllm", urls=urls, model=MODEL, eject_after_failures=2, cooldown_s=10
    )  # fmt: skip


def _assert_no_secret(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"{leaked} in {text}"


def test_stats_show_each_replica_and_the_cooldown_left_of_an_ejected_one(pair):
    bad_url, good_url = pair
    clock = Clock()
    query = _query_preferring(bad_url, pair)

    async def go() -> None:
        engine = PoolEngine(_config(pair), clock=clock)
        await engine.start()
        try:
            assert [r["cooldown_left_s"] for r in engine.stats()["replicas"]] == [None, None]
            for _ in range(2):  # refused twice (each answered by the good replica): ejected for 10 s
                await engine.score(ScoreJob(query=query, instruction="", texts=["a", "b"]))
            seen = [engine.stats()]
            clock.now += 3.33
            seen.append(engine.stats())
            clock.now += 7  # the cooldown is over: 0, not negative, until a probe readmits it
            seen.append(engine.stats())
            await engine.check_health()
            seen.append(engine.stats())
        finally:
            await engine.stop()
        bad = [s["replicas"][0] for s in seen]
        assert [(b["admitted"], b["cooldown_left_s"]) for b in bad] == [
            (False, 10.0), (False, 6.7), (False, 0.0), (True, None)
        ]  # fmt: skip
        assert bad[0]["url"] == f"http://***@127.0.0.1:{urlsplit(bad_url).port}"
        assert {k: bad[0][k] for k in ("consecutive_failures", "ejections", "next_cooldown_s")} == {
            "consecutive_failures": 2, "ejections": 1, "next_cooldown_s": 20.0
        }  # fmt: skip
        assert seen[0]["replicas"][1] == {
            "url": good_url, "admitted": True, "outstanding": 0, "served": 2, "consecutive_failures": 0,
            "ejections": 0, "next_cooldown_s": 10.0, "cooldown_left_s": None,
        }  # fmt: skip
        _assert_no_secret(repr(seen))

    with structlog.testing.capture_logs() as logs:
        asyncio.run(go())
    events = {e["event"] for e in logs}
    assert {"pool_upstream_misconfigured", "replica_ejected", "replica_readmitted"} <= events, events
    _assert_no_secret(repr(logs))


def test_ready_shows_the_replicas_without_their_credentials(pair):
    bad_url, _good_url = pair
    query = _query_preferring(bad_url, pair)
    app = create_app(Settings(models=(_config(pair),)), configure_logs=False)
    with structlog.testing.capture_logs() as logs, TestClient(app) as client:
        wait_loaded(client)
        for _ in range(2):
            r = client.post("/v1/rerank", json={"model": "pool", "query": query, "documents": ["a", "b"]})
            assert r.status_code == 200, r.text
        r = client.get("/ready")  # no key
    assert r.status_code == 200, r.text
    _assert_no_secret(r.text)
    replicas = r.json()["models"][0]["engine_stats"]["replicas"]
    assert replicas[0]["url"].startswith("http://***@127.0.0.1:")
    assert replicas[0]["admitted"] is False and 9 <= replicas[0]["cooldown_left_s"] <= 10
    assert replicas[1]["admitted"] is True and replicas[1]["cooldown_left_s"] is None
    assert "replica_ejected" in {e["event"] for e in logs}
    _assert_no_secret(repr(logs))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://10.0.0.5:8000", "http://10.0.0.5:8000"),
        ("https://user:pw@vllm.internal:8000/v1?token=x&b=2#frag", "https://***@vllm.internal:8000/v1"),
        ("http://only-a-token@host", "http://***@host"),
        ("http://user:p@ss@host:1", "http://***@host:1"),  # an unencoded '@' in the password
        ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
        # An unencoded '?' or '/' in a password ends the host part early: nothing of it shows.
        ("http://user:pa?ss@host", "(URL not shown: it may hold credentials)"),
        ("http://user:12/ss@host", "(URL not shown: it may hold credentials)"),
        ("http://[::1:8000", "(a URL that does not parse)"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("url", "extra", "message"),
    [
        (
            "http://h:8000?token=t0k3n",
            {},
            "'http://h:8000?token=t0k3n' has a query string or fragment; the pool appends",
        ),
        ("http://h:8000/#x", {}, "has a query string or fragment"),
        ("http://alice:s3cr3t-pw@h:8000", {"api_key": "k"}, "'http://***@h:8000' holds credentials and api_key"),
        ("http://alice:s3cr3t-pw@h:8000", {"api_key_env": "K"}, "holds credentials and api_key / api_key_env is set"),
        ("h:8000", {}, "'h:8000' must be an http:// or https:// URL with a host"),
        ("http://h:99999", {}, "'http://h:99999' is not a URL (Port out of range"),
    ],
)
def test_a_pool_url_the_pool_cannot_call_is_refused_at_load(url, extra, message):
    """The pool appends its API's path to each URL (a query string would swallow it), and aiohttp
    refuses credentials in a URL beside an Authorization header (every call failed with a
    ValueError): refused at load, in one line, without the credentials."""
    import msgspec

    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert(
            {"models": [{"name": "p", "engine": "pool", "protocol": "vllm", "urls": [url], **extra}]}, Settings
        )
    text = str(info.value)
    assert message in text and "\n" not in text and "s3cr3t" not in text
