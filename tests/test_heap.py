"""The serving process freezes its heap after each model load (``gateway.serving.heap``), and a
restarted engine is still freed: its cycles must not stay frozen with the old model's weights."""

from __future__ import annotations

import gc
import weakref

import msgspec
import pytest

from adapters.base import EngineDeadError
from gateway.serving import heap
from gateway.serving import models as models_mod
from gateway.serving.models import ModelRegistry, ModelState
from schemas.config import Settings


class _CyclicEngine:
    """Refers to itself, as the packed engine's scheduler and its worker threads do: only a
    collection frees it."""

    tokenizer = None

    def __init__(self) -> None:
        self.me = self
        self.weights = bytearray(1 << 20)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def check_health(self) -> None:
        pass


@pytest.fixture
def serving_process(monkeypatch):
    monkeypatch.setattr(models_mod, "build_engine", lambda config: _CyclicEngine())
    monkeypatch.setattr(heap, "_enabled", False)
    heap.enable()
    yield
    gc.unfreeze()


@pytest.mark.anyio
async def test_a_loaded_model_freezes_the_heap_and_a_restart_still_frees_the_old_engine(serving_process):
    settings = msgspec.convert({"models": [{"name": "m", "engine": "static"}]}, Settings)
    rt = ModelRegistry(settings).get("m")
    await rt.load()
    assert rt.state is ModelState.READY
    assert gc.get_freeze_count() > 0
    old = weakref.ref(rt.engine)
    rt.engine_died(rt.engine, EngineDeadError("gone"))
    await rt.restart_task
    assert rt.restarts == 1 and rt.engine is not None and rt.engine is not old()
    gc.collect()
    assert old() is None, "the replaced engine (a frozen cycle) was never freed"
    assert gc.get_freeze_count() > 0  # the new engine's load froze the heap again


def test_an_embedding_process_keeps_its_collector(monkeypatch):
    monkeypatch.setattr(heap, "_enabled", False)
    heap.settle("test")
    assert gc.get_freeze_count() == 0
