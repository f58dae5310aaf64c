"""Qwen3-Reranker on vLLM's generate runner ("vllm-generate").

One generated token, restricted to {yes, no}; the score is P(yes) computed from BOTH
log-probabilities. Two settings make it exact (engines.md):

- ``allowed_token_ids=[yes, no]`` with ``logprobs=2`` returns both log-probabilities always.
  Plain top-k logprobs miss one of them whenever it is outside the top k, and the score then
  collapses to exactly 0.0 or 1.0.
- ``logprobs_mode="processed_logprobs"`` reports them after the allowed-token mask, i.e. a
  softmax over the two logits: P(yes) = e^yes / (e^yes + e^no) = softmax([no, yes])[1].

Use it where the pooling conversion is unavailable (a vLLM build or checkpoint variant without
it) or to run the same weights as a chat model; the score path is cheaper.
"""

from __future__ import annotations

import math
from typing import Any

from vllm import SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

from adapters.base import EngineError, ScoreJob
from adapters.families.base import Family, Row
from adapters.families.qwen3 import Qwen3Family
from adapters.runtimes.vllm_base import VllmEngine

__all__ = ("VllmGenerateEngine", "p_yes")


def p_yes(logprob_yes: float, logprob_no: float) -> float:
    """e^yes / (e^yes + e^no) = sigmoid(yes - no), in the form whose exp cannot overflow."""
    d = logprob_yes - logprob_no
    if d >= 0:
        return 1.0 / (1.0 + math.exp(-d))
    e = math.exp(d)
    return e / (1.0 + e)


class VllmGenerateEngine(VllmEngine):
    """Causal LM, ``max_tokens=1``, exact P(yes) from the yes and no log-probabilities (Qwen3 only)."""

    runtime = "vllm-generate"
    _params: SamplingParams | None = None
    _yes = _no = -1

    def runner_args(self, family: Family) -> dict[str, Any]:
        # schemas.config.FAMILY_RUNTIMES lets only qwen3 reach this runner.
        assert isinstance(family, Qwen3Family)
        prompt = family.tokenizer
        self._yes, self._no = prompt.yes_id, prompt.no_id
        self._params = SamplingParams(
            max_tokens=1,
            temperature=0.0,
            logprobs=2,
            allowed_token_ids=[prompt.yes_id, prompt.no_id],
            detokenize=False,  # only the log-probabilities are read
        )
        return {
            "runner": "generate",
            "logprobs_mode": "processed_logprobs",
            # vLLM counts the generated token against the window: a full-window prompt needs +1.
            "max_model_len": self._config.max_length + 1,
        }

    def finish(self, family: Family, job: ScoreJob, outputs: list[list[float]]) -> list[float]:
        return [out[0] for out in outputs]

    async def run_row(self, engine: AsyncLLM, row: Row, request_id: str) -> list[float]:
        assert self._params is not None
        final = None
        async for output in engine.generate({"prompt_token_ids": row.ids}, self._params, request_id=request_id):
            final = output
        if final is None or not final.outputs or not final.outputs[0].logprobs:
            raise EngineError("vLLM returned no log-probabilities for a generate request")
        logprobs = final.outputs[0].logprobs[0]
        yes, no = logprobs.get(self._yes), logprobs.get(self._no)
        if yes is None or no is None:
            # Never guess the missing one: that is the 0/1 collapse engines.md warns about.
            raise EngineError("vLLM did not return both the yes and the no log-probability")
        return [p_yes(yes.logprob, no.logprob)]
