"""Passive ejection never takes more than ``max_ejected_share`` of a pool out of rotation.

When every replica is slow (overload) or failing at once, ejecting each one after
``eject_after_failures`` turns a slowdown into a full outage: the pool answers 503 "no healthy
replica" for ``cooldown_s`` even once the replicas have recovered. Like Envoy's
``max_ejection_percent``, the pool keeps the rest in rotation (real loopback replicas here).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import structlog
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config.settings import ConfigError, load_settings
from schemas.config import PoolEngineConfig, Settings
from tests.loopback import wait_loaded
from tests.test_pool import FakeReplica

BODY = {"model": "p", "query": "q", "documents": ["a", "b"]}


@pytest.fixture
def replicas():
    made: list[FakeReplica] = []
    yield lambda: made.append(FakeReplica("infinity")) or made[-1]
    for replica in made:
        replica.close()


@contextmanager
def _serve(**kw: Any) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(models=(PoolEngineConfig(name="p", **kw),)), configure_logs=False)) as client:
        wait_loaded(client)
        yield client


def _admitted(client: TestClient) -> list[bool]:
    return [s["admitted"] for s in client.app.state.registry.get("p").engine.replica_stats()]


def test_an_overloaded_pool_keeps_half_its_replicas_in_rotation(replicas):
    a, b = replicas(), replicas()
    a.delay_s = b.delay_s = 1.0  # both overloaded: every call hits read_timeout_s
    urls = (a.url, b.url)
    with _serve(
        protocol="infinity", urls=urls, affinity=False, read_timeout_s=0.2, eject_after_failures=2, cooldown_s=30
    ) as client:
        with structlog.testing.capture_logs() as logs:
            assert {client.post("/v1/rerank", json=BODY).status_code for _ in range(6)} == {504}
        assert sorted(_admitted(client)) == [False, True]  # one ejected, the other kept (share 0.5)
        capped = [e for e in logs if e["event"] == "replica_ejection_capped"]
        assert capped and capped[0]["ejected"] == 1 and capped[0]["replicas"] == 2
        a.delay_s = b.delay_s = 0.0  # the overload is over: the pool serves at once, not 503 for 30 s
        assert client.post("/v1/rerank", json=BODY).status_code == 200


def test_the_only_replica_is_not_ejected_by_a_slowdown(replicas):
    up = replicas()
    up.delay_s = 1.0
    with _serve(
        protocol="infinity", urls=(up.url,), read_timeout_s=0.2, eject_after_failures=2, cooldown_s=30
    ) as client:
        assert [client.post("/v1/rerank", json=BODY).status_code for _ in range(3)] == [504] * 3
        assert _admitted(client) == [True]
        up.delay_s = 0.0
        assert client.post("/v1/rerank", json=BODY).status_code == 200


def test_failing_replicas_are_ejected_up_to_the_share(replicas):
    ups = [replicas() for _ in range(4)]
    for up in ups:
        up.healthy = False  # 503 to every call and probe: each request tries all four
    with _serve(protocol="infinity", urls=tuple(u.url for u in ups), eject_after_failures=1, cooldown_s=30) as client:
        r = client.post("/v1/rerank", json=BODY)
        assert r.status_code == 503 and "retry-after" in r.headers
        assert sorted(_admitted(client)) == [False, False, True, True]
        assert client.get("/ready").status_code == 503  # no probe passes: not ready, still capped
        assert sorted(_admitted(client)) == [False, False, True, True]
        for up in ups:
            up.healthy = True
        assert client.post("/v1/rerank", json=BODY).status_code == 200


def test_share_one_ejects_every_replica(replicas):
    up = replicas()
    up.delay_s = 1.0
    with _serve(
        protocol="infinity", urls=(up.url,), read_timeout_s=0.2, eject_after_failures=2, max_ejected_share=1.0
    ) as client:
        assert [client.post("/v1/rerank", json=BODY).status_code for _ in range(2)] == [504, 504]
        assert _admitted(client) == [False]
        assert client.post("/v1/rerank", json=BODY).status_code == 503


@pytest.mark.parametrize(("value", "wanted"), [("1.5", "must be at most 1"), ("-0.1", "must be at least 0")])
def test_a_bad_share_is_one_config_line(tmp_path, value, wanted):
    path = tmp_path / "c.toml"
    path.write_text(
        f'[[models]]\nname = "p"\nengine = "pool"\nprotocol = "vllm"\nurls = ["http://127.0.0.1:9"]\n'
        f"max_ejected_share = {value}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    assert f"models[0].max_ejected_share: {wanted}" in str(err.value) and "\n" not in str(err.value)


def test_the_cap_is_logged_once_per_capped_spell_not_per_ready_poll(replicas):
    up = replicas()  # a pool of one: the default share (0.5) never ejects it
    with _serve(protocol="infinity", urls=(up.url,), cooldown_s=30) as client:
        up.healthy = False
        with structlog.testing.capture_logs() as logs:
            assert {client.get("/ready").status_code for _ in range(5)} == {503}
            up.healthy = True  # its probe passes: the cap holds nothing back any more
            assert client.get("/ready").status_code == 200
            up.healthy = False  # and fails again: a new spell, a new line
            assert {client.get("/ready").status_code for _ in range(3)} == {503}
        capped = [e for e in logs if e["event"] == "replica_ejection_capped"]
        assert len(capped) == 2, capped  # not one per poll (8)
        assert _admitted(client) == [True]
