"""Bi-encoders: any sentence-transformers embedding model used as a reranker.

The query and each document are embedded apart (the query once per request, as its own row in
the same length-sorted batches as the documents), pooled as the checkpoint's
``1_Pooling/config.json`` says (every mode sentence-transformers has: cls, mean, max, lasttoken,
weightedmean, mean_sqrt_len_tokens, or several concatenated; ``pooling`` overrides; both file
layouts are read by ``adapters.families.st_files``, which refuses a pipeline the gateway would
compute differently), and scored by cosine similarity (a trailing Normalize module scales each
embedding to length 1, which leaves the cosine as it is). Scores: ``(1 + cos) / 2`` in [0, 1]
(monotone, so the order is the cosine's); ``raw_scores``: the cosine itself, in [-1, 1].

The service still truncates and chunks in token space: a document's room is the window minus
the special tokens, whatever the query (``item_room``), and a long document scores as its best
chunk like with every other family.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from adapters.base import EngineConfigError, ScoreJob
from adapters.families.base import Row
from adapters.families.detect import st_pipeline
from adapters.families.encoder import EncoderFamily, EncoderTokenizer

__all__ = ("BiEncoderFamily", "SingleTokenizer")


# Texts the document prompt is tried before, at load: its ids must be the same alone and joined.
_PROMPT_PROBES = ("Capital", "the capital of France", "0123 !?")


class SingleTokenizer(EncoderTokenizer):
    """:class:`adapters.base.PromptTokenizer` for texts embedded one at a time.

    The shared part is the query's whole sequence (``[CLS] prompt+q [SEP]``); an item is a
    document's ids (or a chunk's), run as ``[CLS] document-prompt item [SEP]``.

    Prompts are put before the text as sentence-transformers' ``encode_query`` /
    ``encode_document`` do: the query's joined to the text before tokenizing (exact); the
    document's as its own ids before every chunk, which is the same only when the prompt
    tokenizes alike alone and joined (checked here on sample texts; refused otherwise).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        window: int,
        max_query_tokens: int,
        query_prompt: str = "",
        document_prompt: str = "",
        tokenize_threads: int | str = 1,
    ) -> None:
        super().__init__(tokenizer, window=window, pair=False, tokenize_threads=tokenize_threads)
        self._query_prompt = query_prompt
        self._document_prompt_ids = self._prompt_ids(document_prompt)
        self._room = window - self.layout.specials - len(self._document_prompt_ids)
        if self._room < 1:
            raise ValueError(f"max_length={window} leaves no room for text beside the special tokens and prompt")
        self._max_query_tokens = min(max_query_tokens, window - self.layout.specials)

    def _prompt_ids(self, prompt: str) -> list[int]:
        if not prompt:
            return []
        ids = self._rust.encode(prompt, add_special_tokens=False).ids
        for text in _PROMPT_PROBES:
            joined = self._rust.encode(prompt + text, add_special_tokens=False).ids
            if joined != ids + self._rust.encode(text, add_special_tokens=False).ids:
                raise EngineConfigError(
                    f"config_sentence_transformers.json: the document prompt {prompt!r} tokenizes differently "
                    "alone and before a text, so chunks cannot carry it exactly; the gateway does not serve it"
                )
        return list(ids)

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        return [
            *self.layout.prefix,
            *self._query_ids(self._query_prompt + query, self._max_query_tokens),
            *self.layout.tail,
        ]

    def item_room(self, shared_ids: Sequence[int]) -> int:
        return self._room

    def wrap(self, ids: Sequence[int]) -> list[int]:
        return [*self.layout.prefix, *self._document_prompt_ids, *ids, *self.layout.tail]


class BiEncoderFamily(EncoderFamily):
    name = "bi-encoder"
    supports_raw_scores = True
    auto_class = "AutoModel"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Raises (naming the module or mode) for a pipeline the gateway would compute differently.
        self.pipeline = st_pipeline(self.files, self.config.pooling)
        self.pooling = self.pipeline.pooling
        self._single: SingleTokenizer | None = None

    @property
    def tokenizer(self) -> SingleTokenizer:
        assert self._single is not None, "load_tokenizer first"
        return self._single

    def load_tokenizer(self) -> SingleTokenizer:
        tok = self._load_fast_tokenizer()
        if self.pipeline.lowercase:
            lowercase_first(tok.backend_tokenizer)
        self._single = SingleTokenizer(
            tok,
            window=self._window,
            max_query_tokens=self.config.max_query_tokens,
            query_prompt=self.pipeline.query_prompt,
            document_prompt=self.pipeline.document_prompt,
            tokenize_threads=self.config.tokenize_threads,
        )
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
        return torch.cat([pool(hidden, mask, mode) for mode in self.pooling], dim=-1)


def lowercase_first(rust: Any) -> None:
    """sentence_bert_config.json's ``do_lower_case``, as sentence-transformers applies it: a
    Lowercase normalizer put first in the Rust tokenizer (unless one is there already)."""
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as NormalizerSequence

    current = rust.normalizer
    if isinstance(current, Lowercase) or (
        isinstance(current, NormalizerSequence) and any(isinstance(n, Lowercase) for n in current)
    ):
        return
    chain = [Lowercase(), *(list(current) if isinstance(current, NormalizerSequence) else [current] if current else [])]
    rust.normalizer = NormalizerSequence(chain)


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """sentence-transformers' pooling ``mode`` of right-padded token embeddings (rows, tokens, dim)."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        return hidden[rows, mask.sum(dim=1) - 1]  # right padding: the last real token of each row
    weights = mask.unsqueeze(-1).float()
    if mode == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if mode == "weightedmean":
        # Token i (from 1) weighs i: later tokens count more (SGPT's position-weighted mean).
        positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=weights.dtype)
        weights = weights * positions.view(1, -1, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    total, count = (hidden * weights).sum(dim=1), weights.sum(dim=1).clamp(min=1e-9)
    if mode == "mean":
        return total / count
    if mode == "mean_sqrt_len_tokens":
        return total / count.sqrt()
    raise ValueError(f"unknown pooling mode {mode!r}")  # st_files refused it at start
