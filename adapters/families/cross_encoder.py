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
from adapters.families.base import Row
from adapters.families.encoder import EncoderFamily, EncoderTokenizer
from adapters.families.st_files import cross_encoder_pipeline, cross_encoder_prompt

__all__ = ("CrossEncoderFamily", "PairTokenizer", "resolve_activation", "resolve_positive_label")

# id2label names read as "this label means relevant" (case-insensitive, exact).
_POSITIVE_NAMES = frozenset({"relevant", "positive", "yes", "true", "entailment", "match", "related"})


class PairTokenizer(EncoderTokenizer):
    """:class:`adapters.base.PromptTokenizer` for a (query, document) pair of an encoder."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        window: int,
        max_query_tokens: int,
        query_prompt: str = "",
        tokenize_threads: int | str = 1,
    ) -> None:
        super().__init__(tokenizer, window=window, pair=True, tokenize_threads=tokenize_threads)
        # sentence-transformers 6.x's CrossEncoder.predict puts its default prompt before the query text.
        self._query_prompt = query_prompt
        # Token types only where the tokenizer hands them to the model (BERT: yes; XLM-R: no).
        self._typed = self.layout.second_segment_typed and "token_type_ids" in tokenizer.model_input_names
        # Half the window at most: a long query must leave documents room to be scored.
        self._max_query_tokens = min(max_query_tokens, (window - self.layout.specials) // 2)
        if self._max_query_tokens < 1:
            raise ValueError(f"max_length={window} leaves no room for a query and a document")

    @property
    def typed(self) -> bool:
        return self._typed

    @property
    def max_query_tokens(self) -> int:
        return self._max_query_tokens

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        return [
            *self.layout.prefix,
            *self._query_ids(self._query_prompt + query, self._max_query_tokens),
            *self.layout.middle,
        ]

    def item_room(self, shared_ids: Sequence[int]) -> int:
        return self._window - len(shared_ids) - len(self.layout.tail)

    def row(self, shared_ids: Sequence[int], item_ids: Sequence[int]) -> Row:
        ids = [*shared_ids, *item_ids, *self.layout.tail]
        return Row(ids, len(shared_ids) if self._typed else None)


def resolve_activation(
    configured: str, config: dict[str, Any], num_labels: int, st_config: dict[str, Any] | None = None
) -> tuple[str, str]:
    """(activation, why): the configured one, else the checkpoint's declared one, else by labels.

    Declared, in sentence-transformers' own order: ``config_sentence_transformers.json``'s
    ``activation_fn`` (6.x writes it there), ``config.json``'s ``sentence_transformers.activation_fn``
    (4.x-5.x), ``sbert_ce_default_activation_function`` (before 4).
    """
    if configured != "auto":
        return configured, f"activation = {configured!r} in the config"
    declared = (
        (st_config or {}).get("activation_fn")
        or (config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function")
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


class CrossEncoderFamily(EncoderFamily):
    name = "cross-encoder"
    supports_raw_scores = True
    auto_class = "AutoModelForSequenceClassification"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg, hf = self.config, self.files.config
        self.num_labels = self.files.num_labels
        # A sentence-transformers 6.x pipeline with more than the classifier (a Dense or LogitScore
        # head) would score differently: refused, naming the module.
        cross_encoder_pipeline(self.files.modules, self.files.sentence_config)
        self.query_prompt = cross_encoder_prompt(self.files.st_config)
        self.activation, self.activation_reason = resolve_activation(
            cfg.activation, hf, self.num_labels, self.files.st_config
        )
        self.positive_label = resolve_positive_label(cfg.positive_label, hf, self.num_labels)
        self._pair: PairTokenizer | None = None

    @property
    def tokenizer(self) -> PairTokenizer:
        assert self._pair is not None, "load_tokenizer first"
        return self._pair

    def load_tokenizer(self) -> PairTokenizer:
        tok = self._load_fast_tokenizer()
        self._pair = PairTokenizer(
            tok,
            window=self._window,
            max_query_tokens=self.config.max_query_tokens,
            query_prompt=self.query_prompt,
            tokenize_threads=self.config.tokenize_threads,
        )
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

    # -- transformers (and the CPU runtime's export) ---------------------------------------------
    @property
    def typed(self) -> bool:
        return self.tokenizer.typed

    def output(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._model(**inputs).logits.float()

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
