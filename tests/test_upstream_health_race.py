"""A /ready health check of an engine that was replaced meanwhile must not judge its successor.

``ModelRegistry.refresh_health`` took ``rt.engine``, awaited its ``check_health`` (up to 5 s)
and then wrote the model's state from that result. When the engine died during the wait and
the background restart put a fresh engine in place (state READY), the old engine's failing
check (it has been stopped) flipped the model to UNHEALTHY: every request got 503 although the
new engine was healthy, until the next /ready poll.
"""

from __future__ import annotations

import asyncio

from gateway.serving.models import ModelRegistry, ModelState
from schemas.config import Settings, StaticEngineConfig


class Engine:
    tokenizer = None

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.stopped = False

    async def check_health(self) -> None:
        await self.release.wait()
        if self.stopped:
            raise RuntimeError("engine is stopped")


def test_a_replaced_engines_failed_check_does_not_mark_its_successor_unhealthy():
    async def go():
        registry = ModelRegistry(Settings(models=(StaticEngineConfig(name="m"),)))
        rt = registry.default
        old, new = Engine(), Engine()
        new.release.set()
        rt.engine, rt.state = old, ModelState.READY
        poll = asyncio.create_task(registry.refresh_health())
        await asyncio.sleep(0.01)  # the poll awaits the old engine's check
        # Meanwhile the old engine died and was replaced (what ModelRuntime._restart ends with).
        old.stopped = True
        rt.engine, rt.state = new, ModelState.READY
        old.release.set()
        await poll
        assert rt.state is ModelState.READY, rt.error
        assert rt.usable_engine() is new

    asyncio.run(go())
