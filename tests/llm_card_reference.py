"""Independent references for the LLM rerankers, written from their model cards.

Shares no code with the gateway (not its prompt presets either): the prompts are typed in
again from the cards, tokenized with the tokenizer's ordinary ``__call__`` the way the cards do,
and scored by a full causal-LM forward (all vocabulary logits) of one prompt at a time.

- BAAI/bge-reranker-v2-gemma, model card "For LLM-based reranker" (``get_inputs``): ``[BOS]
  "A: {query}" "\\n" "B: {passage}" "\\n" prompt``; score = logits[-1, "Yes"], normalized by
  sigmoid.
- mixedbread-ai/mxbai-rerank-v2, ``mxbai_rerank/mxbai_rerank_v2.py`` (MxbaiRerankV2): chat
  prefix, ``[instruction: {i}\\n]query: {q}``, sep, ``document: {d}``, sep, task prompt, chat
  suffix; logits = logit("1") - logit("0") at the last position, sigmoid for a probability.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

GEMMA_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query "
    "by providing a prediction of either 'Yes' or 'No'."
)
MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your "
    "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)
MXBAI_PREFIX = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n"
)
MXBAI_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"


@lru_cache(maxsize=4)
def _load(model_dir: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tok, model


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, return_tensors=None, add_special_tokens=False)["input_ids"])


def gemma_ids(model_dir: str | Path, query: str, passage: str, prompt: str = GEMMA_PROMPT) -> list[int]:
    tok, _ = _load(str(model_dir))
    sep = _ids(tok, "\n")
    return [tok.bos_token_id, *_ids(tok, f"A: {query}"), *sep, *_ids(tok, f"B: {passage}"), *sep, *_ids(tok, prompt)]


def mxbai_ids(model_dir: str | Path, query: str, document: str, instruction: str | None = None) -> list[int]:
    tok, _ = _load(str(model_dir))
    query_prompt = f"query: {query}"
    if instruction:
        query_prompt = f"instruction: {instruction}\nquery: {query}"
    sep = _ids(tok, "\n")
    return [
        *_ids(tok, MXBAI_PREFIX),
        *_ids(tok, query_prompt),
        *sep,
        *_ids(tok, f"document: {document}"),
        *sep,
        *_ids(tok, MXBAI_TASK),
        *_ids(tok, MXBAI_SUFFIX),
    ]


def _last_logits(model_dir: str | Path, ids: Sequence[int]) -> Any:
    import torch

    _, model = _load(str(model_dir))
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0, -1]


def gemma_logits(model_dir: str | Path, query: str, passages: Sequence[str], prompt: str = GEMMA_PROMPT) -> list[float]:
    """The card's compute_score(normalize=False): logit("Yes") at the last position."""
    tok, _ = _load(str(model_dir))
    yes = _ids(tok, "Yes")[0]
    return [float(_last_logits(model_dir, gemma_ids(model_dir, query, p, prompt))[yes]) for p in passages]


def gemma_scores(model_dir: str | Path, query: str, passages: Sequence[str], prompt: str = GEMMA_PROMPT) -> list[float]:
    """The card's compute_score(normalize=True)."""
    return [_sigmoid(x) for x in gemma_logits(model_dir, query, passages, prompt)]


def mxbai_logits(
    model_dir: str | Path, query: str, documents: Sequence[str], instruction: str | None = None
) -> list[float]:
    """MxbaiRerankV2.predict: logit("1") - logit("0") at the last position."""
    tok, _ = _load(str(model_dir))
    yes, no = _ids(tok, "1")[0], _ids(tok, "0")[0]
    out = []
    for document in documents:
        logits = _last_logits(model_dir, mxbai_ids(model_dir, query, document, instruction))
        out.append(float(logits[yes] - logits[no]))
    return out


def mxbai_scores(
    model_dir: str | Path, query: str, documents: Sequence[str], instruction: str | None = None
) -> list[float]:
    """sigmoid of the logits (the card's relevance threshold is sigmoid > 0.5)."""
    return [_sigmoid(x) for x in mxbai_logits(model_dir, query, documents, instruction)]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))
