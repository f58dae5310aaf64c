"""Cross-encoders: a sequence-classification head over the (query, document) pair.

BGE rerankers (XLM-R), ``cross-encoder/ms-marco-*`` (BERT), mxbai-rerank v1 (DeBERTa) and any
other ``*ForSequenceClassification`` checkpoint. The pair is the tokenizer's own layout
(``adapters.families.layout``): shared = ``prefix + query + middle`` (``[CLS] q [SEP]``),
item = the document's ids, suffix = ``tail`` (``[SEP]``), token types where the model has them.

Score: one label -> sigmoid(logit); several -> softmax, the positive label's probability (TEI's
rule). ``activation`` and ``positive_label`` override; a declared sentence-transformers
activation (``activation_fn``) is honoured. ``raw_scores``: the (positive) logit itself. The
activation is applied here, once, for every runtime: vLLM is asked for raw logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from adapters.base import ScoreJob
from adapters.families.base import Family, Row
from adapters.families.layout import SpecialLayout, load_encoder_tokenizer, special_layout

__all__ = ("CrossEncoderFamily", "PairTokenizer", "resolve_activation", "resolve_positive_label")

# id2label names read as "this label means relevant" (case-insensitive, exact).
_POSITIVE_NAMES = frozenset({"relevant", "positive", "yes", "true", "entailment", "match", "related"})


class PairTokenizer:
    """:class:`adapters.base.PromptTokenizer` for a (query, document) pair of an encoder."""

    def __init__(self, tokenizer: Any, *, window: int, max_query_tokens: int) -> None:
        self._rust = tokenizer.backend_tokenizer
        self._encode_batch = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)
        self.layout: SpecialLayout = special_layout(self._rust, pair=True)
        # Token types only where the tokenizer hands them to the model (BERT: yes; XLM-R: no).
        self._typed = self.layout.second_segment_typed and "token_type_ids" in tokenizer.model_input_names
        self._window = window
        # Half the window at most: a long query must leave documents room to be scored.
        self._max_query_tokens = min(max_query_tokens, (window - self.layout.specials) // 2)
        if self._max_query_tokens < 1:
            raise ValueError(f"max_length={window} leaves no room for a query and a document")

    @property
    def max_length(self) -> int:
        return self._window

    @property
    def max_query_tokens(self) -> int:
        return self._max_query_tokens

    @property
    def suffix_length(self) -> int:
        return len(self.layout.tail)

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        # A pair tokenizes its two sequences apart, so cutting the query's ids is exactly what
        # the tokenizer's own truncation of the first sequence gives.
        ids = self._rust.encode(query, add_special_tokens=False).ids[: self._max_query_tokens]
        return [*self.layout.prefix, *ids, *self.layout.middle]

    def item_room(self, shared_ids: Sequence[int]) -> int:
        return self._window - len(shared_ids) - len(self.layout.tail)

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        if not documents:
            return []
        return [enc.ids for enc in self._encode_batch(list(documents), add_special_tokens=False)]

    def row(self, shared_ids: Sequence[int], item_ids: Sequence[int]) -> Row:
        ids = [*shared_ids, *item_ids, *self.layout.tail]
        return Row(ids, len(shared_ids) if self._typed else None)


def resolve_activation(configured: str, config: dict[str, Any], num_labels: int) -> tuple[str, str]:
    """(activation, why): the configured one, else the checkpoint's declared one, else by labels."""
    if configured != "auto":
        return configured, f"activation = {configured!r} in the config"
    declared = (config.get("sentence_transformers") or {}).get("activation_fn") or config.get(
        "sbert_ce_default_activation_function"
    )
    if isinstance(declared, str):
        name = declared.rsplit(".", 1)[-1]
        if name == "Sigmoid":
            return "sigmoid", f"declared by the checkpoint ({declared})"
        if name == "Softmax":
            return "softmax", f"declared by the checkpoint ({declared})"
        # Identity (and anything else) declares raw logits; relevance scores must stay in [0, 1],
        # so the usual rule applies and raw_scores gives the logits.
    if num_labels == 1:
        return "sigmoid", "one label"
    return "softmax", f"{num_labels} labels"


def resolve_positive_label(configured: int | None, config: dict[str, Any], num_labels: int) -> int:
    if configured is not None:
        if configured >= num_labels:
            raise ValueError(f"positive_label={configured} but the head has {num_labels} label(s)")
        return configured
    if num_labels == 1:
        return 0
    id2label = config.get("id2label") or {}
    named = [int(i) for i, label in id2label.items() if str(label).strip().lower() in _POSITIVE_NAMES]
    if len(named) == 1:
        return named[0]
    if num_labels == 2:
        return 1  # the usual (negative, positive) order of binary heads
    raise ValueError(
        f"cannot tell which of the {num_labels} labels ({id2label}) means relevant; set the model's positive_label"
    )


class CrossEncoderFamily(Family):
    name = "cross-encoder"
    supports_raw_scores = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg, hf = self.config, self.files.config
        self.num_labels = self.files.num_labels
        self.activation, self.activation_reason = resolve_activation(cfg.activation, hf, self.num_labels)
        self.positive_label = resolve_positive_label(cfg.positive_label, hf, self.num_labels)
        self._pair: PairTokenizer | None = None
        self._model: Any = None
        self._device: torch.device | None = None
        self._pad_id = int(hf.get("pad_token_id") or 0)
        self._window = cfg.max_length

    @property
    def tokenizer(self) -> PairTokenizer:
        assert self._pair is not None, "load_tokenizer first"
        return self._pair

    def window(self) -> int:
        return self._window

    def load_tokenizer(self) -> PairTokenizer:
        tok, self._window, pad_id = load_encoder_tokenizer(self.config, self.files)
        if pad_id is not None:
            self._pad_id = int(pad_id)
        self._pair = PairTokenizer(tok, window=self._window, max_query_tokens=self.config.max_query_tokens)
        return self._pair

    def rows(self, job: ScoreJob) -> list[Row]:
        pair = self.tokenizer
        return [pair.row(job.shared_ids, item) for item in job.item_ids]

    def scores(self, job: ScoreJob, outputs: Sequence[Sequence[float]] | torch.Tensor) -> list[float]:
        logits = torch.as_tensor(outputs, dtype=torch.float32).reshape(len(outputs), -1)
        if logits.shape[1] != self.num_labels:
            raise ValueError(f"the head returned {logits.shape[1]} values per row, expected {self.num_labels}")
        pos = self.positive_label
        if job.raw_scores:
            return logits[:, pos].tolist()
        if self.activation == "softmax" and self.num_labels > 1:
            return torch.softmax(logits, dim=-1)[:, pos].tolist()
        return torch.sigmoid(logits[:, pos]).tolist()

    # -- transformers --------------------------------------------------------------------------
    def load_torch(self, device: torch.device, dtype: torch.dtype) -> None:
        from transformers import AutoModelForSequenceClassification

        cfg = self.config
        model = AutoModelForSequenceClassification.from_pretrained(
            cfg.path, revision=cfg.revision, dtype=dtype, trust_remote_code=cfg.trust_remote_code
        )
        self._model = model.to(device).eval()
        self._device = device

    def forward(self, rows: list[Row]) -> torch.Tensor:
        width = max(len(r.ids) for r in rows)
        # Right padding with the model's pad id: RoBERTa-style models number positions from the
        # non-pad tokens, so a padded row computes what it would alone.
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        types = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r.ids)] = torch.tensor(r.ids)
            mask[i, : len(r.ids)] = 1
            if r.segment_start is not None:
                types[i, r.segment_start : len(r.ids)] = 1
        inputs = {"input_ids": ids.to(self._device), "attention_mask": mask.to(self._device)}
        if any(r.segment_start is not None for r in rows):
            inputs["token_type_ids"] = types.to(self._device)
        return self._model(**inputs).logits.float()

    def unload(self) -> None:
        self._model = None

    # -- vLLM ----------------------------------------------------------------------------------
    def vllm_runner_args(self) -> dict[str, Any]:
        # Bidirectional attention: a prefix's KV depends on what follows, so prefix caching is
        # wrong (and crashes some pooling models: peers.md, vllm#40682).
        return {"runner": "pooling", "enable_prefix_caching": False}

    def vllm_extra_kwargs(self, row: Row) -> dict[str, Any] | None:
        # vLLM's own score path passes BERT token types this way: the index of the first type-1 token.
        if row.segment_start is None:
            return None
        return {"compressed_token_type_ids": row.segment_start}
