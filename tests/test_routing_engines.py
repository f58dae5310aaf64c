"""A chain over a real local engine (a tiny transformers cross-encoder) in front of a hosted
stand-in (a loopback Cohere-protocol upstream behind a pool): the local engine restarting, and
spill-over when its own queue and step times say a request would wait.

The local model's logit is fixed at 0 (every score 0.5), the upstream answers 0.75: each answer's
scores say which target computed them, and must match its ``x-rerank-target`` header.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from adapters.base import EngineDeadError
from gateway.app import create_app
from schemas.config import ChainEngineConfig, PoolEngineConfig, Settings, TransformersEngineConfig
from tests.fake_cohere_upstream import CohereUpstream
from tests.loopback import wait_loaded
from tests.tiny_encoders import build_tiny_cross_encoder, set_known_logit

SCORE_OF = {"local": 0.5, "hosted": 0.75}
BODY = {"model": "rerank", "query": "rivers", "documents": ["a river runs", "a road", "a lake"]}


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_tiny_cross_encoder(tmp_path_factory.mktemp("chain-ce"))
    set_known_logit(path, 0.0)
    return path


@pytest.fixture
def hosted() -> Iterator[CohereUpstream]:
    server = CohereUpstream(SCORE_OF["hosted"])
    yield server
    server.close()


def _settings(local_dir: Path, url: str, **chain: Any) -> Settings:
    return Settings(
        models=(
            ChainEngineConfig(name="rerank", targets=("local", "hosted"), accepts="other-models", **chain),
            TransformersEngineConfig(name="local", path=str(local_dir), device="cpu", dtype="float32"),
            PoolEngineConfig(name="hosted", protocol="cohere", urls=(url,)),
        )
    )


def _served(response: Any) -> str:
    assert response.status_code == 200, response.text
    target = str(response.headers["x-rerank-target"])
    scores = {round(r["relevance_score"], 6) for r in response.json()["results"]}
    assert scores == {SCORE_OF[target]}, (target, scores)
    return target


def test_the_hosted_target_serves_while_the_local_engine_restarts_then_local_again(local_dir, hosted):
    app = create_app(_settings(local_dir, hosted.url), configure_logs=False)
    with TestClient(app) as client:
        wait_loaded(client)
        assert _served(client.post("/v2/rerank", json=BODY)) == "local"
        local = app.state.registry.get("local")
        # As a request that found it dead would (in the app's loop): 503s from it while it restarts.
        client.blocking_portal.call(local.engine_died, local.engine, EngineDeadError("the test killed it"))
        assert local.restarting
        assert _served(client.post("/v2/rerank", json=BODY)) == "hosted"
        for _ in range(1000):  # bounded: the tiny checkpoint reloads in about a second
            if not local.restarting:
                break
            time.sleep(0.02)
        assert local.restarts == 1
        assert _served(client.post("/v2/rerank", json=BODY)) == "local"


def test_spillover_reads_the_local_engines_expected_wait(local_dir, hosted):
    # Any queued work counts as saturated: a 1 us bound, once the engine has measured a job.
    app = create_app(_settings(local_dir, hosted.url, mode="spillover", spill_wait_s=1e-6), configure_logs=False)
    with TestClient(app) as client:
        wait_loaded(client)
        assert _served(client.post("/v2/rerank", json=BODY)) == "local"  # measures a job's engine time
        engine = app.state.registry.get("local").engine
        assert engine.expected_wait_s() == 0.0  # nothing queued
        # Hold the engine's one forward pass (max_parallel_batches = 1): the next job queues behind it.
        entered, release = threading.Event(), threading.Event()
        forward = engine._forward

        def held(family: Any, rows: Any) -> Any:
            entered.set()
            release.wait(30)
            return forward(family, rows)

        engine._forward = held
        answers: list[Any] = []
        running = threading.Thread(target=lambda: answers.append(client.post("/v2/rerank", json=BODY)))
        running.start()
        assert entered.wait(30)  # in its forward pass: the engine's queue is empty, so no spill yet
        queued = threading.Thread(target=lambda: answers.append(client.post("/v2/rerank", json=BODY)))
        queued.start()
        for _ in range(1000):  # bounded wait for it to reach the engine's queue
            if engine.queue_depth() == 1:
                break
            time.sleep(0.01)
        assert engine.queue_depth() == 1 and engine.expected_wait_s() > 1e-6
        assert _served(client.post("/v2/rerank", json=BODY)) == "hosted"  # spilled
        engine._forward = forward
        release.set()
        running.join(30)
        queued.join(30)
        assert sorted(_served(a) for a in answers) == ["local", "local"]
        assert _served(client.post("/v2/rerank", json=BODY)) == "local"  # the queue is empty again


class _HeldRunner:
    """A packed runner without a GPU whose steps finish only while ``go`` is set (one step in flight)."""

    device = "test"
    pipelined = True
    in_flight = 1

    def __init__(self) -> None:
        self.go = threading.Event()
        self.launched = threading.Event()

    def launch(self, prompts: Any, segments: Any = None, idle: bool = False, eager: bool = False) -> Any:
        self.launched.set()
        return [0.5 for _ in prompts]

    def collect(self, handle: Any) -> Any:
        self.go.wait(30)
        return handle


@pytest.mark.anyio
async def test_the_packed_schedulers_expected_wait_is_its_queued_steps_times_its_step_time():
    import asyncio

    from adapters.runtimes.packed.scheduler import PackedScheduler

    runner = _HeldRunner()
    scheduler = PackedScheduler([runner], batch_tokens=3, max_items=64)  # one 3-token prompt per step
    try:
        assert scheduler.expected_wait_s() == 0.0  # no step measured yet
        runner.go.set()
        await asyncio.wait_for(scheduler.submit([1], [[2]], [3]).future, 5)  # one step: its time is measured
        runner.go.clear()
        runner.launched.clear()
        held = scheduler.submit([1], [[2]], [3])
        for _ in range(500):  # bounded: its step is launched by the scheduler's thread
            if runner.launched.is_set():
                break
            await asyncio.sleep(0.01)
        waiting = scheduler.submit([1], [[2]] * 6, [3])  # six steps' worth, behind the held step
        assert scheduler.queue_depth() == 1
        step_s = scheduler._step_s
        assert step_s is not None and scheduler.expected_wait_s() == pytest.approx(6 * step_s)
        runner.go.set()
        await asyncio.wait_for(asyncio.gather(held.future, waiting.future), 5)
        assert scheduler.queue_depth() == 0 and scheduler.expected_wait_s() == 0.0
    finally:
        runner.go.set()
        scheduler.stop()


def test_a_local_model_chained_to_a_hosted_cohere_model_serves_through_the_restart(local_dir):
    from schemas.config import CohereEngineConfig
    from tests.fake_providers import FakeProviders, Fault, fake_score

    key = "cohere-secret-key-0123456789abcdef"
    with FakeProviders({"cohere": key}) as fake:
        settings = Settings(
            models=(
                ChainEngineConfig(name="rerank", targets=("local", "cohere"), accepts="other-models"),
                TransformersEngineConfig(name="local", path=str(local_dir), device="cpu", dtype="float32"),
                CohereEngineConfig(
                    name="cohere",
                    model="rerank-v3.5",
                    base_url=fake.base_url("cohere"),
                    api_key=key,
                    api_key_env=None,
                    retries=0,
                ),
            )
        )
        app = create_app(settings, configure_logs=False)
        with TestClient(app) as client:
            wait_loaded(client)
            local = app.state.registry.get("local")
            # The tiny checkpoint reloads in ~0.04 s, sooner than the two requests below are sent:
            # its restart waits for the test (without this the 429 case raced it and got a 200 from local).
            release = threading.Event()
            start = local._start_engine

            async def start_when_released() -> None:
                for _ in range(3000):  # bounded: 30 s
                    if release.is_set():
                        break
                    await asyncio.sleep(0.01)
                await start()

            local._start_engine = start_when_released
            client.blocking_portal.call(local.engine_died, local.engine, EngineDeadError("the test killed it"))
            hosted = client.post("/v2/rerank", json=BODY)
            assert hosted.status_code == 200 and hosted.headers["x-rerank-target"] == "cohere"
            # The hosted model's own scores (the fake's), not the local model's 0.5.
            assert {r["index"]: r["relevance_score"] for r in hosted.json()["results"]} == pytest.approx(
                {i: fake_score(BODY["query"], d) for i, d in enumerate(BODY["documents"])}
            )
            # Rate limited too while the local engine is down: no target can take it, 503 with Retry-After.
            fake.fail_next("cohere", Fault(status=429, message="rate limited", headers={"Retry-After": "3"}))
            limited = client.post("/v2/rerank", json=BODY)
            assert limited.status_code == 503 and "Retry-After" in limited.headers
            assert "cohere: failed" in limited.json()["message"]
            release.set()
            for _ in range(1000):  # bounded: the tiny checkpoint reloads in about a second
                if not local.restarting:
                    break
                time.sleep(0.02)
            assert _served(client.post("/v2/rerank", json=BODY)) == "local"
