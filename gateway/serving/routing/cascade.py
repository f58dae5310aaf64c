"""A cascade: one request's documents scored by configured models in turn, each stage keeping its
best ``keep`` documents for the next (``engine = "cascade"``, schemas/config/cascade.py).

Each stage is scored through :meth:`gateway.serving.scoring.Scorer.score_documents`, the
path a request for that model name takes: a stage that is a chain routes (and fails over) by the
chain's rules, any other stage by its own model's -- its ``timeout_s``, admission bound, dedup,
truncation and chunking. A stage's failure is the cascade's (the same status).

The answer (documented in docs/evaluate.md):

- the documents the last stage saw, with the last stage's scores, in its order (equal scores by
  the order sent, as for any model) -- with ``keep`` at or above the documents sent, the answer
  is exactly the last model's alone;
- then the documents an earlier stage dropped: those of the latest stage first, each group in
  the order its stage ranked it. Their ``relevance_score`` is not a model's score (scores of
  different models do not compare): it is a rank placed below the last stage's lowest score
  ``floor``, ``floor x (M - j) / (M + 1)`` for the j-th of the M dropped documents, so sorting
  by score keeps the cascade's order (ties only where ``floor`` is 0).

Stages are scored with the documents in the request's order, so a stage sees the same input as
a request of those documents to its model alone. Usage and billing count every stage's tokens
and items. Raw scores are refused: the answer joins several models' outputs.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from adapters.base import EngineError, EngineTimeoutError
from gateway.errors import RawScoresUnsupportedError
from gateway.serving.model_state import ModelRuntimeState
from schemas.config import CascadeEngineConfig

__all__ = ("Cascade",)

# Scorer.score_documents (typed loosely: gateway.serving.scoring imports this module, through models).
ScoreFn = Callable[..., Awaitable[Any]]


class Cascade:
    def __init__(self, config: CascadeEngineConfig, stages: Sequence[ModelRuntimeState]) -> None:
        self.config = config
        self.stages = list(stages)
        self.keeps = [stage.keep for stage in config.stages]

    @property
    def fingerprint(self) -> str:
        """The response cache's fingerprint: the keeps and every stage's fingerprint (a chain's own)."""
        parts = [",".join(str(k) for k in self.keeps)]
        for rt in self.stages:
            parts.append(rt.chain.fingerprint if rt.chain is not None else rt.fingerprint)
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()

    def status(self) -> dict[str, Any]:
        """``/ready``: the stages and what each keeps."""
        return {
            "stages": [
                {"model": rt.name, "keep": k, "state": rt.state.value}
                for rt, k in zip(self.stages, self.keeps, strict=True)
            ]
        }

    async def score(
        self,
        score_documents: ScoreFn,
        *,
        query: str,
        texts: Sequence[str],
        instruction: str | None,
        max_tokens_per_doc: int | None,
        max_chunks_per_doc: int | None,
        long_texts: Any,
        raw_scores: bool,
    ) -> dict[str, Any]:
        """The fields of one ``Scored`` for ``texts`` (the caller builds it: see the module doc)."""
        if raw_scores:
            raise RawScoresUnsupportedError(
                f"raw scores are not available for model '{self.config.name}': a cascade's answer joins several "
                "models' scores; ask without raw scores"
            )
        try:
            async with asyncio.timeout(self.config.timeout_s):
                return await self._stages(
                    score_documents, query, texts, instruction, max_tokens_per_doc, max_chunks_per_doc, long_texts
                )
        except TimeoutError:
            raise EngineTimeoutError(
                f"model '{self.config.name}' (cascade) did not answer within {self.config.timeout_s:g}s (timeout_s)"
            ) from None

    async def _stages(
        self,
        score_documents: ScoreFn,
        query: str,
        texts: Sequence[str],
        instruction: str | None,
        max_tokens: int | None,
        max_chunks: int | None,
        long_texts: Any,
    ) -> dict[str, Any]:
        alive = list(range(len(texts)))  # request indices the current stage scores, in request order
        dropped: list[list[int]] = []  # per stage, the documents it did not pass on, in its order
        final: dict[int, float] = {}
        tokens = items = 0
        queue_s = tokenize_s = inference_s = 0.0
        for rt, keep in zip(self.stages, self.keeps, strict=True):
            scored = await score_documents(
                rt,
                query=query,
                texts=[texts[i] for i in alive],
                instruction=instruction,
                max_tokens_per_doc=max_tokens,
                max_chunks_per_doc=max_chunks,
                long_texts=long_texts,
                raw_scores=False,
                top_n=None,
            )
            if scored.indices is not None or len(scored.scores) != len(alive):  # no top_n was asked
                raise EngineError(
                    f"cascade '{self.config.name}': stage '{rt.name}' returned "
                    f"{len(scored.scores)} scores for {len(alive)} documents"
                )
            tokens, items = tokens + scored.input_tokens, items + scored.items
            queue_s, tokenize_s = queue_s + scored.queue_s, tokenize_s + scored.tokenize_s
            inference_s += scored.inference_s
            if keep is None:  # the last stage
                final = dict(zip(alive, scored.scores, strict=True))
                break
            order = sorted(range(len(alive)), key=lambda p: (-scored.scores[p], p))
            dropped.append([alive[p] for p in order[keep:]])
            alive = sorted(alive[p] for p in order[:keep])
        floor = min(final.values())
        tail = [i for group in reversed(dropped) for i in group]
        scores = [0.0] * len(texts)
        for i, s in final.items():
            scores[i] = s
        for j, i in enumerate(tail):
            # Below the last stage's lowest score, in the earlier stages' order: a share of it while
            # it is positive, else steps of 1 under it (a stage with raw_scores answers logits, and a
            # share of a negative floor would rise above it).
            scores[i] = floor * (len(tail) - j) / (len(tail) + 1) if floor > 0 else floor - (j + 1)
        return {
            "scores": scores,
            "indices": None,
            "input_tokens": tokens,
            "items": items,
            "queue_s": queue_s,
            "tokenize_s": tokenize_s,
            "inference_s": inference_s,
            "target": self.config.name,
        }
