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
from adapters.families.base import Family, Row
from adapters.families.detect import pooling_mode
from adapters.families.layout import SpecialLayout, load_encoder_tokenizer, special_layout

__all__ = ("BiEncoderFamily", "SingleTokenizer")


class SingleTokenizer:
    """:class:`adapters.base.PromptTokenizer` for texts embedded one at a time.

    The shared part is the query's whole sequence (``[CLS] q [SEP]``); an item is a document's
    ids, wrapped in the same special tokens when it runs.
    """

    def __init__(self, tokenizer: Any, *, window: int, max_query_tokens: int) -> None:
        self._rust = tokenizer.backend_tokenizer
        self._encode_batch = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)
        self.layout: SpecialLayout = special_layout(self._rust, pair=False)
        self._window = window
        self._room = window - self.layout.specials
        if self._room < 1:
            raise ValueError(f"max_length={window} leaves no room for text beside the special tokens")
        self._max_query_tokens = min(max_query_tokens, self._room)

    @property
    def max_length(self) -> int:
        return self._window

    @property
    def suffix_length(self) -> int:
        return len(self.layout.tail)

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        ids = self._rust.encode(query, add_special_tokens=False).ids[: self._max_query_tokens]
        return self.wrap(ids)

    def item_room(self, shared_ids: Sequence[int]) -> int:
        return self._room

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        if not documents:
            return []
        return [enc.ids for enc in self._encode_batch(list(documents), add_special_tokens=False)]

    def wrap(self, ids: Sequence[int]) -> list[int]:
        return [*self.layout.prefix, *ids, *self.layout.tail]


class BiEncoderFamily(Family):
    name = "bi-encoder"
    supports_raw_scores = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pooling = pooling_mode(self.files, self.config.pooling)
        self._single: SingleTokenizer | None = None
        self._model: Any = None
        self._device: torch.device | None = None
        self._pad_id = int(self.files.config.get("pad_token_id") or 0)
        self._window = self.config.max_length

    @property
    def tokenizer(self) -> SingleTokenizer:
        assert self._single is not None, "load_tokenizer first"
        return self._single

    def window(self) -> int:
        return self._window

    def load_tokenizer(self) -> SingleTokenizer:
        tok, self._window, pad_id = load_encoder_tokenizer(self.config, self.files)
        if pad_id is not None:
            self._pad_id = int(pad_id)
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

    # -- transformers --------------------------------------------------------------------------
    def load_torch(self, device: torch.device, dtype: torch.dtype) -> None:
        from transformers import AutoModel

        cfg = self.config
        model = AutoModel.from_pretrained(cfg.path, revision=cfg.revision, dtype=dtype, trust_remote_code=cfg.trust_remote_code)
        self._model = model.to(device).eval()
        self._device = device

    def forward(self, rows: list[Row]) -> torch.Tensor:
        width = max(len(r.ids) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r.ids)] = torch.tensor(r.ids)
            mask[i, : len(r.ids)] = 1
        mask = mask.to(self._device)
        hidden = self._model(input_ids=ids.to(self._device), attention_mask=mask).last_hidden_state.float()
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "lasttoken":
            last = mask.sum(dim=1) - 1  # right padding: the last real token of each row
            return hidden[torch.arange(len(rows), device=hidden.device), last]
        weights = mask.unsqueeze(-1).float()
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)

    def unload(self) -> None:
        self._model = None
