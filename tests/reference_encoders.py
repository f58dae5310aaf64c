"""Independent reference scores for encoder families: the straightforward way, no gateway code.

- cross-encoder: ``tokenizer(query, document)`` (the tokenizer's own pair encoding and
  truncation), one plain ``AutoModelForSequenceClassification`` forward per pair, then sigmoid
  (one label) or softmax and the positive label.
- bi-encoder: ``tokenizer(text)`` per text, plain ``AutoModel`` forward, mean (or CLS) pooling of
  the last hidden state, cosine similarity, ``(1 + cos) / 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=8)
def _load(model_dir: str, kind: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    cls = AutoModelForSequenceClassification if kind == "cross" else AutoModel
    return tok, cls.from_pretrained(model_dir, dtype=torch.float32).eval()


def cross_logits(model_dir: str | Path, query: str, documents: Sequence[str]) -> list[list[float]]:
    import torch

    tok, model = _load(str(model_dir), "cross")
    out = []
    with torch.no_grad():
        for doc in documents:
            enc = tok(query, doc, return_tensors="pt")
            out.append(model(**enc).logits[0].tolist())
    return out


def cross_scores(
    model_dir: str | Path, query: str, documents: Sequence[str], *, positive: int | None = None
) -> list[float]:
    import torch

    scores = []
    for logits in cross_logits(model_dir, query, documents):
        t = torch.tensor(logits)
        if t.numel() == 1:
            scores.append(torch.sigmoid(t[0]).item())
        else:
            scores.append(torch.softmax(t, dim=0)[positive if positive is not None else -1].item())
    return scores


def embed(model_dir: str | Path, texts: Sequence[str], *, pooling: str = "mean") -> Any:
    import torch

    tok, model = _load(str(model_dir), "bi")
    rows = []
    with torch.no_grad():
        for text in texts:
            enc = tok(text, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]
            rows.append(hidden[0] if pooling == "cls" else hidden.mean(dim=0))
    return torch.stack(rows)


def bi_scores(
    model_dir: str | Path, query: str, documents: Sequence[str], *, pooling: str = "mean", raw: bool = False
) -> list[float]:
    import torch

    q = embed(model_dir, [query], pooling=pooling)[0]
    d = embed(model_dir, documents, pooling=pooling)
    cos = torch.nn.functional.cosine_similarity(d, q.unsqueeze(0), dim=-1)
    return cos.tolist() if raw else ((1 + cos) / 2).tolist()
