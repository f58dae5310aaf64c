"""What a GGUF file says about itself (architecture, head, vocabulary, rerank template), read
with the ``gguf`` package without loading the model, and the refusal of a file without a head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.base import EngineConfigError

# Architectures whose rank-pooling graph ends in a softmax (llama-graph.cpp): output 0 is P(yes).
_SOFTMAX_ARCHS = frozenset({"qwen3", "qwen3vl"})


class NoRerankHeadError(EngineConfigError):
    """The GGUF has no classification head: rank pooling would return meaningless scores."""


@dataclass(frozen=True)
class GgufInfo:
    """What the GGUF file says about itself, read without loading the model."""

    path: str
    architecture: str
    context_length: int | None
    pooling_type: int | None
    file_type: str
    labels: tuple[str, ...]
    has_cls: bool
    has_cls_out: bool
    cls_out_rows: int | None
    rerank_template: str | None
    # Rows of the token-type table (BERT: 2, XLM-R: 1); None when the file does not say.
    token_type_count: int | None = None

    @property
    def family(self) -> str:
        return "qwen3" if self.architecture in _SOFTMAX_ARCHS else "cross-encoder"

    @property
    def n_outputs(self) -> int:
        if self.labels:
            return len(self.labels)
        return self.cls_out_rows or 1


def inspect_gguf(path: str) -> GgufInfo:
    """Read the GGUF's metadata and tensor names (memory-mapped; no weights are computed on)."""
    import gguf

    reader = gguf.GGUFReader(path)

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    arch = str(value("general.architecture") or "")
    tensors = {t.name: t for t in reader.tensors}
    cls_out = tensors.get("cls.output.weight")
    ftype = value("general.file_type")
    try:
        file_type = gguf.LlamaFileType(ftype).name.removeprefix("ALL_").removeprefix("MOSTLY_").lower()
    except (TypeError, ValueError):
        file_type = "unknown"
    return GgufInfo(
        path=path,
        architecture=arch,
        context_length=value(f"{arch}.context_length"),
        pooling_type=value(f"{arch}.pooling_type"),
        file_type=file_type,
        labels=tuple(value(f"{arch}.classifier.output_labels") or ()),
        has_cls="cls.weight" in tensors,
        has_cls_out=cls_out is not None,
        # GGUF shapes are (in, out): the second dimension counts the head's outputs.
        cls_out_rows=int(cls_out.shape[-1]) if cls_out is not None else None,
        rerank_template=value("tokenizer.chat_template.rerank"),
        # GGUF shapes are (in, out): the second dimension counts the table's rows.
        token_type_count=int(types.shape[-1]) if (types := tensors.get("token_types.weight")) is not None else None,
    )


def check_rerank_head(info: GgufInfo) -> None:
    if info.has_cls_out or info.has_cls:
        return
    raise NoRerankHeadError(
        f"{info.path} has no rerank head (no cls / cls.output tensors; architecture "
        f"{info.architecture!r}): llama.cpp would score every document near zero. Use a GGUF "
        "converted from the sequence-classification checkpoint by llama.cpp's convert_hf_to_gguf.py "
        "(bge-reranker-*, or Qwen3-Reranker converted by llama.cpp after PR #14029, which writes "
        "the yes/no head and the rerank template)"
    )
