"""Any family vLLM's pooling runner serves ("vllm-score"): Qwen3-Reranker and cross-encoders.

Each row (the family's token ids) is a ``classify`` request. vLLM is asked for the head's raw
output (``use_activation=False``) and the family applies its activation once, the same code as
on transformers: Qwen3's online conversion gives the yes-minus-no logit (sigmoid of it =
softmax([no, yes])[1]); a BERT/XLM-R cross-encoder gives its label logits (sigmoid, or softmax
and the positive label). vLLM's own default would apply sigmoid or softmax itself, and a second
one on top squeezes scores (peers.md: node-llama-cpp#617); a test pins a known logit.
"""

from __future__ import annotations

from typing import Any

from vllm import PoolingParams
from vllm.v1.engine.async_llm import AsyncLLM

from adapters.base import EngineError, ScoreJob
from adapters.families.base import Family, Row
from adapters.runtimes.vllm_base import VllmEngine

__all__ = ("VllmScoreEngine",)


class VllmScoreEngine(VllmEngine):
    """Pooling runner + classify task on token ids, activation left to the family."""

    runtime = "vllm-score"

    def runner_args(self, family: Family) -> dict[str, Any]:
        return family.vllm_runner_args()

    async def run_row(self, engine: AsyncLLM, row: Row, request_id: str) -> list[float]:
        # During warm-up self._family is not set yet; rows carry what the family needs.
        family = self._family or self._starting
        extra = family.vllm_extra_kwargs(row) if family is not None else None
        params = PoolingParams(task="classify", use_activation=False, extra_kwargs=extra)
        final = None
        async for output in engine.encode({"prompt_token_ids": row.ids}, params, request_id=request_id):
            final = output
        if final is None:
            raise EngineError("vLLM returned no output for a classify request")
        return [float(x) for x in final.outputs.data.reshape(-1).tolist()]

    def finish(self, family: Family, job: ScoreJob, outputs: list[list[float]]) -> list[float]:
        return family.vllm_scores(job, outputs)
