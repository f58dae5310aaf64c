"""Per-key limits shared through a real Redis by two real gateway processes, and Redis outages.

The fixture starts ``redis-server`` (Debian package ``redis-server``; ``.ci/run`` installs it)
on a free loopback port, and two ``rerank-gateway serve`` processes with the same config, as
two replicas behind a load balancer would run. A missing ``redis-server`` fails the tests: a
skip would hide that the shared limits went untested.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.security.auth import generate_key, hash_key
from schemas.config import ApiKeyConfig, AuthConfig, LimitsConfig, Settings, StaticEngineConfig
from tests.conftest import ServerProcess, free_port
from tests.test_auth import wait_in_flight

pytestmark = pytest.mark.slow

RPM = 25
KEYS = {name: generate_key() for name in ("burst", "tokens", "conc")}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: apt-get install -y redis-server (see .ci/run)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"redis-server did not start (exit code {proc.poll()})")
            time.sleep(0.05)
    client.close()
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


def on_flushed_redis(url: str, body: Callable[[Any], Awaitable[Any]]) -> Any:
    """``body(client)`` on an asyncio client of ``url``'s database, emptied first; its result."""

    async def main() -> Any:
        client = redis.asyncio.Redis.from_url(url)
        try:
            await client.flushdb()
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def _config(redis_url: str) -> str:
    keys = "".join(
        f'[[auth.keys]]\nid = "{name}"\nhash = "{hash_key(key)}"\nmodels = ["*"]\n{limit}\n'
        for (name, key), limit in zip(KEYS.items(), (f"rpm = {RPM}", "tpm = 10", "max_concurrent = 1"), strict=True)
    )
    return (
        f'[limits]\nredis_url = "{redis_url}"\nredis_timeout_s = 30\n'
        '[[models]]\nname = "m"\nengine = "static"\n'
        '[[models]]\nname = "slow"\nengine = "static"\ndelay_s = 1.0\n' + keys
    )


@pytest.fixture(scope="module")
def replicas(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    tmp = tmp_path_factory.mktemp("replicas")
    servers = [ServerProcess(_config(redis_url), tmp) for _ in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


def _body(model: str = "m", docs: tuple[str, ...] = ("a",)) -> dict:
    return {"model": model, "query": "q", "documents": list(docs)}


async def _burst(urls: list[str], key: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        # Alternate the replicas, like a round-robin load balancer.
        calls = [
            client.post(f"{urls[i % len(urls)]}/v1/rerank", json=_body(), headers={"Authorization": f"Bearer {key}"})
            for i in range(n)
        ]
        return await asyncio.gather(*calls)


def test_rpm_is_exact_across_two_replicas_under_concurrent_load(replicas, redis_url):
    urls = [s.url for s in replicas]
    responses = asyncio.run(_burst(urls, KEYS["burst"], 4 * RPM))
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: RPM, 429: 3 * RPM}, statuses
    for resp in responses:
        assert resp.headers["x-ratelimit-limit"] == str(RPM)
        if resp.status_code == 429:
            assert resp.headers["x-ratelimit-remaining"] == "0" and 1 <= int(resp.headers["retry-after"]) <= 60
    # Each replica alone would admit RPM of its 2 x RPM requests (2 x RPM in total); together
    # they admit RPM. The window stays full for both.
    again = asyncio.run(_burst(urls, KEYS["burst"], 10))
    assert {r.status_code for r in again} == {429}
    # Redis holds key ids only, never a key or its hash.
    client = redis.Redis.from_url(redis_url)
    names = b" ".join(client.scan_iter(count=1000)).decode()
    client.close()
    assert "burst" in names
    for key in KEYS.values():
        assert key not in names and hash_key(key).split(":")[1] not in names


def test_tpm_budget_is_shared_across_replicas(replicas):
    a, b = (s.url for s in replicas)
    headers = {"X-API-Key": KEYS["tokens"]}
    # The static engine counts 1 query word x 2 documents + 4 + 1 document words = 7 tokens.
    docs = ("one two three four", "five")
    first = httpx.post(f"{a}/v1/rerank", json=_body(docs=docs), headers=headers)
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining-tokens"] == "3"
    second = httpx.post(f"{b}/v1/rerank", json=_body(docs=docs), headers=headers)
    assert second.status_code == 200  # 3 tokens left when admitted; charged 7
    third = httpx.post(f"{a}/v2/rerank", json=_body(), headers=headers)
    assert third.status_code == 429, third.text
    assert third.headers["x-ratelimit-limit"] == "10" and third.headers["x-ratelimit-remaining"] == "0"


def test_max_concurrent_is_shared_across_replicas(replicas):
    a, b = (s.url for s in replicas)
    headers = {"Authorization": f"bearer {KEYS['conc']}"}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, f"{a}/v1/rerank", json=_body("slow"), headers=headers, timeout=30)
        wait_in_flight(lambda path: httpx.get(f"{a}{path}"), "slow")  # replica A holds the key's one slot
        refused = httpx.post(f"{b}/v1/rerank", json=_body(), headers=headers)
        assert running.result().status_code == 200
    assert refused.status_code == 429, refused.text
    assert "max_concurrent" in refused.json()["message"] and refused.headers["retry-after"] == "1"
    # The lease was released in Redis: the other replica admits the key again.
    assert httpx.post(f"{b}/v1/rerank", json=_body(), headers=headers).status_code == 200


def _unreachable_settings(failure: str) -> Settings:
    # A free port with nothing listening: connections are refused at once.
    key = ApiKeyConfig(id="k", hash=hash_key(KEYS["burst"]), models=("*",), rpm=1)
    return Settings(
        limits=LimitsConfig(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_failure=failure),
        auth=AuthConfig(keys=(key,)),
        models=(StaticEngineConfig(name="m"),),
    )


def test_unreachable_redis_fails_closed_with_503():
    headers = {"Authorization": f"Bearer {KEYS['burst']}"}
    with TestClient(create_app(_unreachable_settings("closed"), configure_logs=False)) as client:
        resp = client.post("/v1/rerank", json=_body(), headers=headers)
        assert resp.status_code == 503, resp.text
        assert "limit store unreachable" in resp.json()["message"] and resp.headers["retry-after"] == "5"
        assert 'rerank_requests_total{key="k",model="-",status="503"} 1.0' in client.get("/metrics").text


def test_unreachable_redis_fails_open_to_per_process_limits():
    headers = {"Authorization": f"Bearer {KEYS['burst']}"}
    with TestClient(create_app(_unreachable_settings("open"), configure_logs=False)) as client:
        assert client.post("/v1/rerank", json=_body(), headers=headers).status_code == 200
        # Still limited, by this process's own counters: rpm = 1.
        assert client.post("/v1/rerank", json=_body(), headers=headers).status_code == 429


def test_redis_timeout_bounds_the_wait(tmp_path: Path):
    # A listener that accepts but never answers (a hung Redis): the request must not hang. The
    # proof is an event, not a duration: the gateway itself hangs up on every connection it opened
    # (its redis_timeout_s expired; a client without one would wait forever and never close), and
    # the request is answered 503. The 60 s join only guards the test against a real hang.
    import socket
    import threading

    import msgspec

    accepted: list[socket.socket] = []
    closed_by_gateway: list[bool] = []

    def serve(server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # the test closed the listener
                return
            accepted.append(conn)
            threading.Thread(target=drain, args=(conn,), daemon=True).start()

    def drain(conn: socket.socket) -> None:
        try:
            while conn.recv(65536):  # read the commands, answer nothing
                pass
            closed_by_gateway.append(True)  # b"": the gateway hung up
        except OSError:
            pass

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        threading.Thread(target=serve, args=(server,), daemon=True).start()
        settings = msgspec.structs.replace(
            _unreachable_settings("closed"),
            limits=LimitsConfig(redis_url=f"redis://127.0.0.1:{port}/0", redis_timeout_s=0.2),
        )
        result: list[httpx.Response] = []
        with TestClient(create_app(settings, configure_logs=False)) as client:
            asker = threading.Thread(
                target=lambda: result.append(
                    client.post("/v1/rerank", json=_body(), headers={"X-API-Key": KEYS["burst"]})
                )
            )
            asker.start()
            asker.join(60)
            assert result, "the request hung on an unanswering Redis"
            deadline = time.monotonic() + 30  # the drain threads see the hang-ups a moment later
            while len(closed_by_gateway) < len(accepted) and time.monotonic() < deadline:
                time.sleep(0.02)
            hung_up = (len(accepted), len(closed_by_gateway))
        for conn in accepted:
            conn.close()
    assert result[0].status_code == 503, result[0].text
    # One connection, given up by the gateway: a command that timed out is not sent again on a
    # new one (it may have run: a quota charged twice, an admin write applied twice).
    assert hung_up == (1, 1), hung_up
