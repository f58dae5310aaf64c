"""Independent reference computation of Qwen3-Reranker scores: the straightforward way.

Full forward pass of the causal LM over the whole prompt (all vocabulary logits), softmax over
the "no"/"yes" logits at the last position -- exactly Qwen's published recipe, sharing no code
with the engines (which use the backbone's last hidden state and two head rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@lru_cache(maxsize=4)
def _load(model_dir: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tok, model


def prompt_text(instruction: str, query: str, document: str) -> str:
    return f"{PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{SUFFIX}"


def tokenize(model_dir: str | Path, text: str) -> list[int]:
    tok, _ = _load(str(model_dir))
    return list(tok(text, add_special_tokens=False)["input_ids"])


def score_ids(model_dir: str | Path, prompts: Sequence[Sequence[int]]) -> list[float]:
    """One full forward per prompt (no batching, no padding), P(yes) over {no, yes}."""
    import torch

    tok, model = _load(str(model_dir))
    yes = tok.convert_tokens_to_ids("yes")
    no = tok.convert_tokens_to_ids("no")
    out = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([list(ids)])).logits[0, -1]
            out.append(torch.softmax(torch.stack([logits[no], logits[yes]]), dim=0)[1].item())
    return out


def score_texts(
    model_dir: str | Path, query: str, documents: Sequence[str], instruction: str = DEFAULT_INSTRUCTION
) -> list[float]:
    return score_ids(model_dir, [tokenize(model_dir, prompt_text(instruction, query, d)) for d in documents])


def chunked_max(
    model_dir: str | Path,
    query: str,
    document: str,
    *,
    max_length: int,
    instruction: str = DEFAULT_INSTRUCTION,
    max_tokens: int | None = None,
    max_chunks: int = 10,
) -> float:
    """Cohere's rule computed by hand: truncate, split the document's tokens into windows that fit
    beside the prompt, score each window, keep the max."""
    head = tokenize(model_dir, f"{PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n<Document>:")
    tail = tokenize(model_dir, SUFFIX)
    doc = tokenize(model_dir, " " + document)
    if max_tokens is not None:
        doc = doc[:max_tokens]
    room = max_length - len(head) - len(tail)
    chunks = [doc[i : i + room] for i in range(0, len(doc), room)][:max_chunks]
    return max(score_ids(model_dir, [head + c + tail for c in chunks]))
