"""The response cache in a real Redis after a restart: same model config hits, new weights or settings miss.

Each ``gateway`` block is one process lifetime; the Redis outlives them, as it outlives a restart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import CacheConfig, EngineConfig, Settings, StaticEngineConfig, TransformersEngineConfig
from tests.test_ratelimit_redis import redis_url  # noqa: F401  (the real redis-server fixture)
from tests.tiny_encoders import build_tiny_cross_encoder

pytestmark = pytest.mark.slow

DOCS = ["Washington is the capital.", "Quantum computing uses qubits.", "no"]


@contextmanager
def gateway(model: EngineConfig, url: str) -> Iterator[TestClient]:
    cache = CacheConfig(enabled=True, backend="redis", redis_url=url)
    with TestClient(create_app(Settings(models=(model,), cache=cache), configure_logs=False)) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").json()
            time.sleep(0.05)
        yield client


def ask(model: EngineConfig, url: str, query: str) -> tuple[str, list[Any]]:
    with gateway(model, url) as client:
        resp = client.post("/v2/rerank", json={"model": "m", "query": query, "documents": DOCS})
    assert resp.status_code == 200, resp.text
    return resp.headers["x-cache"], [(r["index"], r["relevance_score"]) for r in resp.json()["results"]]


STATIC = StaticEngineConfig(name="m", scores={DOCS[1]: 0.9})


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        pytest.param(STATIC, "hit", id="same-config"),
        pytest.param(
            StaticEngineConfig(name="m", scores={DOCS[1]: 0.9}, timeout_s=5, aliases=("m2",)),
            "hit",
            id="time-limit-and-alias",
        ),
        pytest.param(StaticEngineConfig(name="m", scores={DOCS[2]: 0.9}), "miss", id="new-weights"),
        pytest.param(StaticEngineConfig(name="m", scores={DOCS[1]: 0.9}, score=0.1), "miss", id="new-default-score"),
    ],
)
def test_restart_hits_only_with_the_same_scoring_config(changed: EngineConfig, expected: str, redis_url: str) -> None:  # noqa: F811
    query = f"q {time.time()}"  # a fresh entry whatever ran before
    assert ask(STATIC, redis_url, query)[0] == "miss"
    assert ask(changed, redis_url, query)[0] == expected


def test_new_weights_at_the_same_path_miss(tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    path = build_tiny_cross_encoder(tmp_path / "ce", seed=0)
    model = TransformersEngineConfig(name="m", path=str(path), device="cpu", dtype="float32")
    query = f"capital {time.time()}"
    cache, old = ask(model, redis_url, query)
    assert cache == "miss"
    assert ask(model, redis_url, query) == ("hit", old)
    build_tiny_cross_encoder(path, seed=1)  # a new checkpoint copied over the old one, same config
    cache, new = ask(model, redis_url, query)
    assert cache == "miss" and new != old
