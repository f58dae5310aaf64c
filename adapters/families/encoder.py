"""What the two encoder families share: the tokenizer wrapper, the weights and the padded batch.

A cross-encoder and a bi-encoder differ only in what they run (a (query, document) pair through
a classification head; each text alone through the bare encoder, then pooling) and in their
score rule. Loading the fast tokenizer, capping the window, finding the pad id, loading the
weights with the right ``Auto*`` class and right-padding a batch of rows are the same code, so
they live here once (``cross_encoder.py`` and ``bi_encoder.py`` subclass both classes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from adapters.families.base import Family, Row
from adapters.families.layout import SpecialLayout, load_encoder_tokenizer, special_layout
from adapters.families.split_encode import SplitEncoder, resolve_tokenize_threads

__all__ = ("EncoderFamily", "EncoderTokenizer")


class EncoderTokenizer:
    """Common part of an encoder's :class:`adapters.base.PromptTokenizer`: the Rust tokenizer,
    its special-token layout (around a pair or a single text) and the window."""

    def __init__(self, tokenizer: Any, *, window: int, pair: bool, tokenize_threads: int | str = 1) -> None:
        self._rust = tokenizer.backend_tokenizer
        self._encode_batch = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)
        self._split = SplitEncoder(self._encode_batch, resolve_tokenize_threads(tokenize_threads))
        self.layout: SpecialLayout = special_layout(self._rust, pair=pair)
        self._window = window

    @property
    def max_length(self) -> int:
        return self._window

    @property
    def vocab(self) -> dict[str, int]:
        """Token -> id (the parity gate builds its golden set from the tokenizer's own words)."""
        return dict(self._rust.get_vocab())

    @property
    def suffix_length(self) -> int:
        return len(self.layout.tail)

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        if not documents:
            return []
        return self._split(list(documents))

    def _query_ids(self, query: str, max_tokens: int) -> list[int]:
        # Cutting the query's own ids is what the tokenizer's truncation of that sequence gives:
        # a pair tokenizes its two sequences apart.
        return self._rust.encode(query, add_special_tokens=False).ids[:max_tokens]


class EncoderFamily(Family):
    """A family whose model is a Hugging Face encoder loaded through ``auto_class``."""

    auto_class: ClassVar[str]  # a transformers Auto* class name

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._model: Any = None
        self._device: torch.device | None = None
        self._pad_id = int(self.files.config.get("pad_token_id") or 0)
        self._window = self.config.max_length

    def window(self) -> int:
        return self._window

    def _load_fast_tokenizer(self) -> Any:
        """The checkpoint's tokenizer; sets the window (capped at the checkpoint's) and pad id."""
        tok, self._window, pad_id = load_encoder_tokenizer(self.config, self.files)
        if pad_id is not None:
            self._pad_id = int(pad_id)
        return tok

    # -- transformers --------------------------------------------------------------------------
    def load_torch(self, device: torch.device, dtype: torch.dtype) -> None:
        import transformers

        cfg = self.config
        model = getattr(transformers, self.auto_class).from_pretrained(
            cfg.path, revision=cfg.revision, dtype=dtype, trust_remote_code=cfg.trust_remote_code
        )
        self._model = model.to(device).eval()
        self._device = device

    def padded_inputs(self, rows: list[Row]) -> dict[str, torch.Tensor]:
        """Model inputs of one batch, on the model's device.

        Right padding with the model's pad id: RoBERTa-style models number positions from the
        non-pad tokens, so a padded row computes what it would alone. Token types only when a
        row has a second segment (BERT pairs).
        """
        width = max(len(r.ids) for r in rows)
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
        return inputs

    @property
    def typed(self) -> bool:
        """True when the model is given token type ids (BERT pairs); the CPU export's inputs."""
        return False

    def output(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(rows, k) outputs of one padded batch: what ``forward`` returns, from model inputs
        (also the graph the CPU runtime exports, so both runtimes compute one thing)."""
        raise NotImplementedError

    def forward(self, rows: list[Row]) -> torch.Tensor:
        return self.output(self.padded_inputs(rows))

    def unload(self) -> None:
        self._model = None
