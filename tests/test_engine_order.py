"""vLLM engines start before any other engine of the gateway, so they never inherit its CUDA context.

Issue 24: beside a packed model that had initialised CUDA in the gateway process first, vLLM
had to spawn its engine core and served 18-21 % slower on an H200. The registry now starts the
vLLM models first and the others once those have started (or failed); a vLLM start after CUDA
is initialised chooses spawn explicitly.
"""

from __future__ import annotations

import asyncio
import sys
import types

import msgspec
import pytest

from gateway.serving import models as models_module
from gateway.serving.models import ModelRegistry, ModelState
from schemas.config import Settings

EVENTS: list[str] = []


class _Engine:
    def __init__(self, config):
        self.name = config.name
        self.fail = getattr(config, "max_query_tokens", None) == 7  # a vLLM model whose start fails

    async def start(self):
        EVENTS.append(f"start {self.name}")
        await asyncio.sleep(0.05)  # a slow start: another model starting meanwhile would show
        if self.fail:
            EVENTS.append(f"failed {self.name}")
            raise RuntimeError("no room for the KV cache")
        EVENTS.append(f"started {self.name}")

    async def stop(self):
        pass


def _settings(*models):
    return msgspec.convert({"server": {"load_retry_initial_s": 30}, "models": list(models)}, Settings)


@pytest.fixture(autouse=True)
def fake_engines(monkeypatch):
    EVENTS.clear()
    monkeypatch.setattr(models_module, "build_engine", _Engine)


async def _load(settings):
    registry = ModelRegistry(settings)
    registry.start()
    try:
        for _ in range(200):
            if all(rt.load_attempts and rt.state is not ModelState.LOADING for rt in registry):
                break
            await asyncio.sleep(0.01)
        return registry, list(EVENTS)
    finally:
        await registry.stop()


@pytest.mark.anyio
async def test_vllm_models_start_before_the_others():
    # Listed after the packed and static models, still started first.
    _, events = await _load(
        _settings(
            {"name": "packed", "engine": "packed", "path": "/m"},
            {"name": "fixed", "engine": "static"},
            {"name": "vllm", "engine": "vllm-score", "path": "/m"},
            {"name": "gen", "engine": "vllm-generate", "path": "/m"},
        )
    )
    firsts = events[:4]
    assert sorted(firsts) == ["start gen", "start vllm", "started gen", "started vllm"]  # the two vLLM ones together
    assert set(events[4:]) == {"start packed", "started packed", "start fixed", "started fixed"}


@pytest.mark.anyio
async def test_a_failed_vllm_start_does_not_block_the_others():
    registry, events = await _load(
        _settings(
            {"name": "packed", "engine": "packed", "path": "/m"},
            {"name": "vllm", "engine": "vllm-score", "path": "/m", "max_query_tokens": 7},
        )
    )
    assert events[:2] == ["start vllm", "failed vllm"]
    assert events[2:] == ["start packed", "started packed"]
    assert registry.get("vllm").state is ModelState.FAILED and registry.get("packed").state is ModelState.READY


@pytest.mark.anyio
async def test_without_vllm_models_nothing_waits():
    _, events = await _load(
        _settings({"name": "a", "engine": "static"}, {"name": "b", "engine": "packed", "path": "/m"})
    )
    assert events[:2] == ["start a", "start b"]  # both at once


def test_vllm_start_after_cuda_init_chooses_spawn(monkeypatch):
    vllm_base = pytest.importorskip("adapters.runtimes.vllm_base")
    initialised = [False]
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: initialised[0]))
    monkeypatch.setitem(sys.modules, "torch", fake)
    env: dict[str, str] = {}
    assert not vllm_base.spawn_if_cuda_initialized(env) and env == {}
    initialised[0] = True
    assert vllm_base.spawn_if_cuda_initialized(env) and env == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}  # the operator's explicit choice stays
    assert not vllm_base.spawn_if_cuda_initialized(env) and env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
