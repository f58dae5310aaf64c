"""A healthy chain's own CPU, in-process: ``RerankService.rerank`` on a model and on a chain in front of it.

The end-to-end pair (gateway-chain-1w vs gateway-1w) carries the box's noise: on a shared 2-core
machine two runs of the same target differ by more than the chain can cost. Here the routing is
all that differs: one process, the zero-cost ``static`` engine, the suite's 100-document request
with ``top_n`` 10, batches of each alternated (the order swapped each round), and the thread's
CPU time per request read around each batch (``time.thread_time``: other processes' load does
not count). The median of the per-round differences is the chain's CPU per request.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

from gateway.serving.models import ModelRegistry
from gateway.serving.service import RerankService
from schemas.config import ChainEngineConfig, LimitsConfig, Settings, StaticEngineConfig
from schemas.rerank import RerankRequest

__all__ = ("measure",)


async def _measure(body: bytes, rounds: int, batch: int) -> dict[str, Any]:
    settings = Settings(
        models=(
            StaticEngineConfig(name="rerank"),
            ChainEngineConfig(name="rerank-chain", targets=("rerank", "spare"), accepts="replicas"),
            StaticEngineConfig(name="spare"),
        )
    )
    registry = ModelRegistry(settings)
    registry.start()
    await registry.wait_loaded()
    service = RerankService(registry, LimitsConfig())
    payload = json.loads(body)
    requests = {
        name: RerankRequest(
            model=name, query=payload["query"], documents=payload["documents"], top_n=payload.get("top_n")
        )
        for name in ("rerank", "rerank-chain")
    }
    for request in requests.values():  # warm-up
        for _ in range(batch):
            await service.rerank(request, api_version="2", request_id="x")
    per: dict[str, list[float]] = {name: [] for name in requests}
    for rnd in range(rounds):
        order = list(requests) if rnd % 2 else list(reversed(requests))
        for name in order:
            t0 = time.thread_time()
            for _ in range(batch):
                await service.rerank(requests[name], api_version="2", request_id="x")
            per[name].append((time.thread_time() - t0) / batch * 1e6)
    await registry.stop()
    deltas = [c - p for p, c in zip(per["rerank"], per["rerank-chain"], strict=True)]
    return {
        "rounds": rounds,
        "requests_per_batch": batch,
        "plain_us_per_request": round(statistics.median(per["rerank"]), 2),
        "chain_us_per_request": round(statistics.median(per["rerank-chain"]), 2),
        "chain_added_us_per_request": round(statistics.median(deltas), 2),
        "deltas_us": [round(d, 2) for d in deltas],
    }


def measure(body: bytes, rounds: int = 40, batch: int = 200) -> dict[str, Any]:
    """The chain's added CPU per request (µs), in-process; see the module's docstring."""
    return asyncio.run(_measure(body, rounds, batch))
