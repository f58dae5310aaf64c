"""Bi-encoders: any sentence-transformers embedding model used as a reranker.

The query and each document are embedded apart (the query once per request, as its own row in
the same length-sorted batches as the documents), pooled as the checkpoint's
``1_Pooling/config.json`` says (mean, CLS or last token; ``pooling`` overrides), and scored by
cosine similarity (so a trailing Normalize module changes nothing). Scores: ``(1 + cos) / 2`` in
[0, 1] (monotone, so the order is the cosine's);
``raw_scores``: the cosine itself, in [-1, 1].

The service still truncates and chunks in token space: a document's room is the window minus
the special tokens, whatever the query (``item_room``), and a long document scores as its best
chunk like with every other family.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from adapters.base import ScoreJob
from adapters.families.base import Row
from adapters.families.detect import pooling_mode
from adapters.families.encoder import EncoderFamily, EncoderTokenizer

__all__ = ("BiEncoderFamily", "SingleTokenizer")


class SingleTokenizer(EncoderTokenizer):
    """:class:`adapters.base.PromptTokenizer` for texts embedded one at a time.

    The shared part is the query's whole sequence (``[CLS] q [SEP]``); an item is a document's
    ids, wrapped in the same special tokens when it runs.
    """

    def __init__(self, tokenizer: Any, *, window: int, max_query_tokens: int) -> None:
        super().__init__(tokenizer, window=window, pair=False)
        self._room = window - self.layout.specials
        if self._room < 1:
            raise ValueError(f"max_length={window} leaves no room for text beside the special tokens")
        self._max_query_tokens = min(max_query_tokens, self._room)

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        return self.wrap(self._query_ids(query, self._max_query_tokens))

    def item_room(self, shared_ids: Sequence[int]) -> int:
        return self._room

    def wrap(self, ids: Sequence[int]) -> list[int]:
        return [*self.layout.prefix, *ids, *self.layout.tail]


class BiEncoderFamily(EncoderFamily):
    name = "bi-encoder"
    supports_raw_scores = True
    auto_class = "AutoModel"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pooling = pooling_mode(self.files, self.config.pooling)
        self._single: SingleTokenizer | None = None

    @property
    def tokenizer(self) -> SingleTokenizer:
        assert self._single is not None, "load_tokenizer first"
        return self._single

    def load_tokenizer(self) -> SingleTokenizer:
        tok = self._load_fast_tokenizer()
        self._single = SingleTokenizer(tok, window=self._window, max_query_tokens=self.config.max_query_tokens)
        return self._single

    def rows(self, job: ScoreJob) -> list[Row]:
        single = self.tokenizer
        # Row 0 is the query, embedded once for all the job's documents.
        return [Row(list(job.shared_ids)), *(Row(single.wrap(item)) for item in job.item_ids)]

    def scores(self, job: ScoreJob, outputs: Sequence[Sequence[float]] | torch.Tensor) -> list[float]:
        emb = torch.as_tensor(outputs, dtype=torch.float32)
        emb = torch.nn.functional.normalize(emb, dim=-1)
        cos = (emb[1:] @ emb[0]).clamp(-1.0, 1.0)
        return cos.tolist() if job.raw_scores else ((1.0 + cos) / 2.0).tolist()

    # -- transformers (and the CPU runtime's export) ---------------------------------------------
    def output(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = inputs["attention_mask"]
        hidden = self._model(**inputs).last_hidden_state.float()
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "lasttoken":
            last = mask.sum(dim=1) - 1  # right padding: the last real token of each row
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        weights = mask.unsqueeze(-1).float()
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
