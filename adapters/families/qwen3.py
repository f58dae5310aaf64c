"""The Qwen3-Reranker prompt, built in token space; shared by every local Qwen3 engine.

Qwen's recipe (engines.md, and vLLM's ``qwen3_reranker.jinja``, which renders the same text)::

    <|im_start|>system\\nJudge whether ... "yes" or "no".<|im_end|>\\n<|im_start|>user\\n
    <Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {doc}
    <|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n

Score = softmax([logit("no"), logit("yes")])[1] at the last position.

We tokenize three pieces separately so that documents can be truncated and chunked without
cutting the suffix, and so that the part one request shares (everything up to ``<Document>:``)
comes first and is tokenized once:

- shared: ``PREFIX + "<Instruct>: {i}\\n<Query>: {q}\\n<Document>:"``
- document: ``" " + doc``
- suffix: ``SUFFIX``

The cut points sit where Qwen's (and GPT-2's) pre-tokenizer always splits -- after ``:``
before a space, and before a special token -- so the concatenated ids equal those of the whole
prompt tokenized at once (tests check this against the plain full-string reference).

Qwen3 is one preset of the LLM-reranker family (``adapters.families.llm``, whose pieces
generalize these three); this module keeps the Qwen3 names.
"""

from __future__ import annotations

from typing import Any

from adapters.families.llm import (
    LlmPromptTokenizer,
    LlmRerankerFamily,
    attention_override,
    load_hf_tokenizer,
    max_position_embeddings,
)
from schemas.config import LLM_RERANKERS

__all__ = (
    "PREFIX",
    "SUFFIX",
    "Qwen3Family",
    "Qwen3PromptTokenizer",
    "attention_override",
    "load_hf_tokenizer",
    "max_position_embeddings",
    "render_prompt",
)

# The Qwen3 preset of the LLM-reranker spec (schemas.config.LLM_RERANKERS) is the one source of
# the prompt; these names stay for the code and tests written against them.
SPEC = LLM_RERANKERS["qwen3"]
PREFIX = SPEC.head[0].partition("<Instruct>:")[0]
SUFFIX = SPEC.tail[0]


def render_prompt(instruction: str, query: str, document: str) -> str:
    """The whole prompt as one string: the reference the token pieces must reproduce."""
    return f"{PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{SUFFIX}"


class Qwen3PromptTokenizer(LlmPromptTokenizer):
    """Token pieces of the Qwen3 prompt (the packed runtime builds it directly)."""

    def __init__(
        self, tokenizer: Any, *, max_length: int, max_query_tokens: int, tokenize_threads: int | str = 1
    ) -> None:
        super().__init__(
            tokenizer, SPEC, max_length=max_length, max_query_tokens=max_query_tokens, tokenize_threads=tokenize_threads
        )


class Qwen3Family(LlmRerankerFamily):
    """Qwen3-Reranker: the yes/no prompt; score = softmax([no, yes])[1] at the last position.

    On transformers only the backbone's hidden state at the last position and the two LM-head
    rows for "no" and "yes" are computed (never 151,669-way logits at every position).
    """

    name = "qwen3"
    spec = SPEC

    def _make_prompt(
        self, tokenizer: Any, *, max_length: int, max_query_tokens: int, tokenize_threads: int | str = 1
    ) -> Qwen3PromptTokenizer:
        return Qwen3PromptTokenizer(
            tokenizer, max_length=max_length, max_query_tokens=max_query_tokens, tokenize_threads=tokenize_threads
        )
