"""The ways of scoring that are compared: our engines behind the gateway's ``RerankService``, raw
offline ``vllm.LLM.score``, and the seed's design (that ``LLM`` behind a lock, serial batches).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from benchmarks.engine_bench.workload import Request, ScoreFn
from schemas.config import DEFAULT_INSTRUCTION

HF_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}


# -- our engines through the gateway's service -----------------------------------------------------
async def gateway_service_variant(
    kind: str, model_dir: str, extra: dict[str, Any]
) -> tuple[Any, ScoreFn, Callable[[], Awaitable[None]]]:
    from gateway.serving.models import ModelRegistry
    from gateway.serving.service import RerankService
    from schemas.config import Settings
    from schemas.rerank import RerankRequest

    settings = msgspec.convert({"models": [{"name": kind, "engine": kind, "path": model_dir, **extra}]}, Settings)
    registry = ModelRegistry(settings)
    registry.start()
    await registry.wait_loaded()
    if not registry.ready:
        await registry.stop()
        raise RuntimeError(f"{kind} failed to load: {registry.statuses()}")
    service = RerankService(registry, settings.limits)
    return registry, service_score(service, kind, RerankRequest), registry.stop


def service_score(service: Any, model: str, request_type: Any) -> ScoreFn:
    counter = iter(range(1 << 62))
    timings: list[tuple[float, float]] = []

    async def score(req: Request) -> list[float]:
        out = await service.rerank(
            request_type(query=req[0], documents=req[1], model=model),
            api_version="2",
            request_id=f"bench-{next(counter)}",
        )
        timings.append((out.tokenize_ms, out.inference_ms))
        by_index = {r.index: r.relevance_score for r in out.response.results}
        return [by_index[i] for i in range(len(req[1]))]

    score.timings = timings  # type: ignore[attr-defined]  # (tokenize ms, inference ms) per request
    return score


# -- raw offline vLLM and the seed's design --------------------------------------------------------
def raw_llm(model_dir: str, small: bool, gpu_util: float) -> Any:
    from vllm import LLM

    kw: dict[str, Any] = {
        "model": model_dir,
        "max_model_len": 2048,
        "seed": 0,
        "enable_prefix_caching": True,
        "gpu_memory_utilization": gpu_util,
        "runner": "pooling",
        "hf_overrides": HF_OVERRIDES,
    }
    if small:
        kw.update(enforce_eager=True, dtype="float32")
    else:
        kw.update(dtype="bfloat16")
    return LLM(**kw)


def _texts(req: Request) -> tuple[str, list[str]]:
    from adapters.families.qwen3 import PREFIX, SUFFIX

    query = f"{PREFIX}<Instruct>: {DEFAULT_INSTRUCTION}\n<Query>: {req[0]}\n"
    return query, [f"<Document>: {d}{SUFFIX}" for d in req[1]]


def raw_score_fns(llm: Any, pool: ThreadPoolExecutor) -> tuple[ScoreFn, Callable[[list[Request]], Awaitable[None]]]:
    def one(req: Request) -> list[float]:
        q, docs = _texts(req)
        return [o.outputs.score for o in llm.score(q, docs, use_tqdm=False)]

    def many(reqs: list[Request]) -> None:
        qs, ds = [], []
        for r in reqs:
            q, docs = _texts(r)
            qs += [q] * len(docs)
            ds += docs
        llm.score(qs, ds, use_tqdm=False)

    loop = asyncio.get_running_loop()

    async def score(req: Request) -> list[float]:
        return await loop.run_in_executor(pool, one, req)

    async def batch(reqs: list[Request]) -> None:
        await loop.run_in_executor(pool, many, reqs)

    return score, batch


def seed_fn(llm: Any, pool: ThreadPoolExecutor, infer_batch_size: int = 100) -> ScoreFn:
    """The seed: one lock around the offline engine; dedup, length sort, serial batches."""
    lock = threading.Lock()

    def one(req: Request) -> list[float]:
        q, docs = _texts(req)
        unique = list(dict.fromkeys(docs))
        order = sorted(range(len(unique)), key=lambda i: len(unique[i]))
        scores: dict[str, float] = {}
        with lock:
            for k in range(0, len(order), infer_batch_size):
                batch = [unique[i] for i in order[k : k + infer_batch_size]]
                for d, o in zip(batch, llm.score(q, batch, use_tqdm=False), strict=True):
                    scores[d] = o.outputs.score
        return [scores[d] for d in docs]

    loop = asyncio.get_running_loop()

    async def score(req: Request) -> list[float]:
        return await loop.run_in_executor(pool, one, req)

    return score
