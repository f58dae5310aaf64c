"""Qwen3-Reranker on vLLM's pooling runner ("vllm-score").

vLLM converts the original causal-LM checkpoint online into a sequence classifier whose one
output is sigmoid((W[yes] - W[no]) . h_last): exactly softmax([no, yes])[1] of the LM head at
the last position, without ever computing the full-vocabulary logits. The gateway sends token
ids (its own template), so vLLM's score API and chat template are not involved: each item is a
``classify`` request on one prompt.
"""

from __future__ import annotations

from typing import Any

from vllm import PoolingParams
from vllm.v1.engine.async_llm import AsyncLLM

from adapters.base import EngineError
from adapters.families.qwen3 import Qwen3PromptTokenizer
from adapters.runtimes.vllm_base import VllmQwen3Engine, engine_prompt

__all__ = ("QWEN3_RERANKER_OVERRIDES", "VllmScoreEngine")

# vLLM's documented online conversion of the original Qwen3-Reranker checkpoint.
QWEN3_RERANKER_OVERRIDES: dict[str, Any] = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}


class VllmScoreEngine(VllmQwen3Engine):
    """Pooling runner + classify task on token ids."""

    _params = PoolingParams(task="classify")

    def runner_args(self, prompt: Qwen3PromptTokenizer) -> dict[str, Any]:
        return {"runner": "pooling", "hf_overrides": dict(QWEN3_RERANKER_OVERRIDES)}

    async def score_prompt(self, engine: AsyncLLM, prompt_ids: list[int], request_id: str) -> float:
        final = None
        async for output in engine.encode(engine_prompt(prompt_ids), self._params, request_id=request_id):
            final = output
        if final is None:
            raise EngineError("vLLM returned no output for a classify request")
        data = final.outputs.data.reshape(-1)
        # The converted head has one output, the sigmoid of yes-minus-no; anything else means
        # the conversion did not apply (a checkpoint that is not an original Qwen3-Reranker).
        if data.numel() != 1:
            raise EngineError(f"vLLM classifier returned {data.numel()} values, expected 1 (P(yes))")
        return float(data[0])
