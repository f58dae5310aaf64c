"""The LLM family's label/document cut, checked on documents its probes were not written from.

``adapters/families/llm.py`` tokenizes a label (Gemma's ``B: ``) apart from the document when a few
probe documents (``_SPLIT_PROBES``) tokenize the same apart and together, and glues the label to
each document otherwise. The probes were written beside tests/test_llm_rerankers.py's documents,
so those tests cannot find a document shape the probes miss. Here the documents are generated
from a seed instead: every printable ASCII character and a set of non-ASCII ones (accents, CJK,
emoji, typographic quotes and dashes, a no-break space, a BOM, a tab, CR LF) at the document's
start, followed by random words and symbols. Each must give the card's own token ids -- the
label and document tokenized together, as the card does.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

import msgspec
import pytest

from adapters.families.llm import _SPLIT_PROBES, LlmPromptTokenizer, load_hf_tokenizer
from schemas.config import LLM_RERANKERS
from tests import llm_card_reference as card

Q = "Which passage names a capital?"
_OTHER_STARTS = [
    "é",
    "Ünter",
    "ß",
    "中文",
    "日本",
    "😀",
    "—",
    "–",
    "“quoted”",
    "‘single’",
    "…",
    "\u00a0nbsp",
    "\ufeffbom",
    "\u200bzero",
    "\t",
    "\r\n",
    "\n\n",
    "   ",
    "１２３",
    "Ω",
    "→",
]
_WORDS = ["capital", "Paris", "the", "of", "is", "42", "x", "don't", "U.S.", "e-mail", "C++", "#tag", "@user", "(a)"]


def _documents(seed: int = 42) -> list[str]:
    """A document starting with each printable ASCII character and each of ``_OTHER_STARTS``, then 0-6 words."""
    rng = random.Random(seed)
    starts = [c for c in string.printable if c not in "\x0b\x0c"] + _OTHER_STARTS
    docs = []
    for start in starts:
        tail = rng.choice(["", " ", ""]) + " ".join(rng.choices(_WORDS, k=rng.randint(0, 6)))
        docs.append(start + tail)
    return docs


def test_the_generated_documents_are_not_the_probes() -> None:
    docs = _documents()
    assert len(docs) == len(set(docs)) > 100
    assert not set(docs) & set(_SPLIT_PROBES)


def _prompt(model_dir: Path, spec: object) -> LlmPromptTokenizer:
    return LlmPromptTokenizer(load_hf_tokenizer(str(model_dir)), spec, max_length=512, max_query_tokens=64)  # type: ignore[arg-type]


@pytest.mark.parametrize("label_cut", ["card", "space on the label's side"])
def test_gemma_ids_equal_the_cards_on_unseen_document_shapes(tiny_gemma_dir: Path, label_cut: str) -> None:
    spec = LLM_RERANKERS["bge-reranker-v2-gemma"]
    if label_cut != "card":  # the cut tests/test_llm_rerankers.py shows the label glued for
        spec = msgspec.structs.replace(spec, middle=("\n", "B: "), document="{document}")
    prompt = _prompt(tiny_gemma_dir, spec)
    shared = prompt.encode_shared(Q, prompt.default_instruction)
    docs = _documents()
    wrong = [
        doc
        for doc, ids in zip(docs, prompt.encode_documents(docs), strict=True)
        if prompt.assemble(shared, ids, prompt.default_instruction) != card.gemma_ids(tiny_gemma_dir, Q, doc)
    ]
    assert not wrong, f"{len(wrong)} of {len(docs)} documents tokenized unlike the card: {wrong[:10]!r}"


def test_mxbai_ids_equal_the_cards_on_unseen_document_shapes(tiny_qwen2_dir: Path) -> None:
    prompt = _prompt(tiny_qwen2_dir, LLM_RERANKERS["mxbai-rerank-v2"])
    shared = prompt.encode_shared(Q, "")
    docs = _documents()
    wrong = [
        doc
        for doc, ids in zip(docs, prompt.encode_documents(docs), strict=True)
        if prompt.assemble(shared, ids) != card.mxbai_ids(tiny_qwen2_dir, Q, doc)
    ]
    assert not wrong, f"{len(wrong)} of {len(docs)} documents tokenized unlike the card: {wrong[:10]!r}"
