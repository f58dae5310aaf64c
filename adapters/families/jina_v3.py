"""Jina reranker v3 (``jinaai/jina-reranker-v3``): listwise, the checkpoint's own code.

The model ships its code (``trust_remote_code``): ``AutoModel.from_pretrained(path,
trust_remote_code=True)`` gives an object whose ``rerank(query, documents)`` tokenizes, builds
its listwise prompt (query and many documents in one causal window) and returns
``[{"index", "relevance_score", ...}]`` sorted by score. That is the recipe of the older
service (seeds/002) and of Jina's model card; we call exactly that, nothing lower.

Consequences for the gateway's shape:

- It is a *text* family: the model tokenizes itself and lays documents out in its own prompt,
  so the service cannot truncate or chunk in token space for it; it hands over texts
  (``tokenizer`` is None on the engine, as for upstreams). Duplicates are still scored once.
- Documents go in blocks of ``block_size`` (the old service's ``batch_size``): one
  ``rerank`` call per block, so a long list never overflows the model's window; each block's
  scores are mapped back to input positions by the ``index`` the model returns. Scores of
  documents in different blocks were computed beside different neighbours: that is the
  listwise trade-off the old service documented (64 fast, 125 closer to one full window).
- ``relevance_score`` is a cosine similarity in [-1, 1] (the model scores documents by the
  cosine of its query and document embeddings); the gateway maps it to [0, 1] as
  ``(1 + s) / 2`` (order kept), or returns it as is with ``raw_scores = true``.

Weights and remote code cannot be fetched in our CI: tests load a small local module with the
same interface through this same loading code (``tests/tiny_jina.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from adapters.base import EngineError, PromptTokenizer, ScoreJob
from adapters.families.base import Family, Row

if TYPE_CHECKING:
    import torch

__all__ = ("JinaV3Family",)


class JinaV3Family(Family):
    name = "jina-v3"
    supports_raw_scores = True
    takes_texts: ClassVar[bool] = True

    _model: Any = None
    _counter: Any = None

    # -- the text path (what the transformers runtime calls for this family) ---------------
    @property
    def block_size(self) -> int:
        return int(getattr(self.config, "block_size", 64))

    def load_torch(self, device: torch.device, dtype: torch.dtype) -> None:
        from transformers import AutoModel

        cfg = self.config
        if not cfg.trust_remote_code:
            raise ValueError(
                f"'{cfg.path}' is a Jina reranker v3 model, which runs the checkpoint's own code: "
                "set trust_remote_code = true for this model if you trust that code"
            )
        model = AutoModel.from_pretrained(cfg.path, revision=cfg.revision, dtype=dtype, trust_remote_code=True)
        if not callable(getattr(model, "rerank", None)):
            raise ValueError(  # noqa: TRY004  # a wrong checkpoint for the family: a config error, as above
                f"'{cfg.path}' loaded as {type(model).__name__}, which has no rerank(query, documents) "
                "method: not a Jina reranker v3 checkpoint (set family to match the model)"
            )
        model.to(device)
        model.eval()
        self._model = model
        self._counter = _token_counter(model, cfg.path, cfg.revision)

    def unload(self) -> None:
        self._model = self._counter = None

    def score_block(self, query: str, documents: Sequence[str], *, raw: bool) -> list[float]:
        """One ``model.rerank`` call; scores in the block's input order (worker thread)."""
        import torch

        model = self._model
        if model is None:
            raise EngineError("model is not loaded")
        with torch.inference_mode():
            results = model.rerank(query, list(documents))
        scores: list[float | None] = [None] * len(documents)
        for item in results:
            try:
                index, score = int(item["index"]), float(item["relevance_score"])
            except (KeyError, TypeError, ValueError) as exc:
                raise EngineError(f"model.rerank returned an item without index/relevance_score: {exc!r}") from None
            if not 0 <= index < len(documents) or scores[index] is not None:
                raise EngineError(f"model.rerank returned index {index} for {len(documents)} documents")
            scores[index] = score if raw else min(1.0, max(0.0, (1.0 + score) / 2.0))
        if any(s is None for s in scores):
            raise EngineError(f"model.rerank returned {len(results)} results for {len(documents)} documents")
        return [float(s) for s in scores if s is not None]

    def count_tokens(self, query: str, documents: Sequence[str], blocks: int) -> int:
        """Tokens the model processed: the query once per block, every document once."""
        count = self._counter or _word_count
        return count(query) * blocks + sum(count(d) for d in documents)

    # -- the token path does not apply: the model tokenizes itself -------------------------
    @property
    def tokenizer(self) -> PromptTokenizer:
        raise TypeError("jina-v3 takes texts (the model tokenizes itself); it has no prompt tokenizer")

    def load_tokenizer(self) -> PromptTokenizer:
        raise TypeError("jina-v3 takes texts (the model tokenizes itself); it has no prompt tokenizer")

    def rows(self, job: ScoreJob) -> list[Row]:
        raise TypeError("jina-v3 scores texts listwise through model.rerank, not token rows")

    def scores(self, job: ScoreJob, outputs: Any) -> list[float]:
        raise TypeError("jina-v3 scores texts listwise through model.rerank, not token rows")


def _word_count(text: str) -> int:
    return len(text.split())


def _token_counter(model: Any, path: str, revision: str | None) -> Any:
    """Count with the model's own tokenizer when it has one (for usage and rate limits)."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(path, revision=revision)
        except Exception:  # noqa: BLE001  # no tokenizer files: fall back to words, documented in docs/engines.md
            return None

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return count
