"""The rerank prompt as llama.cpp's server builds it (``format_prompt_rerank``), tokenized by the
gateway: the template cut into a head (up to the query), the document and a tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from adapters.runtimes.gguf.metadata import GgufInfo


class GgufPromptTokenizer:
    """:class:`adapters.base.PromptTokenizer` over the GGUF's own vocabulary (llama.cpp tokenizer).

    User text is tokenized with special-token parsing off (a document cannot inject ``</s>``);
    template text with it on.
    """

    def __init__(self, llm: Any, info: GgufInfo, *, max_length: int, max_query_tokens: int) -> None:
        import llama_cpp

        self._llm = llm
        self._max_length = max_length
        self.default_instruction = ""  # the template's own (the service sends it when a request has none)
        self._instruct_at: tuple[int, int] | None = None  # where it lies in the head's text
        self._heads: dict[str, list[int]] = {}  # head ids by request instruction
        self._max_query_tokens = max_query_tokens
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        template = info.rerank_template
        if template is not None:
            (head, between), tail = _split_template(template)
            # A space before a placeholder goes with the text it precedes ("<Query>: " + "q" ->
            # "<Query>:" + " q"): BPE vocabularies attach a space to the following word, so this is
            # how the whole rendered prompt tokenizes.
            self._query_space, self._doc_space = head.endswith(" "), between.endswith(" ")
            self._head_text = head.removesuffix(" ")
            self._head_ids = self._tokenize(self._head_text, special=True)
            # Qwen3's template (llama.cpp's converter) holds its default instruction as
            # "<Instruct>: ...\n<Query>:": a request's own instruction replaces it, as in the
            # reference prompt; a template without that line has none to replace.
            start = head.find(_INSTRUCT)
            end = head.find(_QUERY_LINE, start + len(_INSTRUCT)) if start >= 0 else -1
            if end >= 0:
                self._instruct_at = (start + len(_INSTRUCT), end)
                self.default_instruction = head[start + len(_INSTRUCT) : end]
            self._between_ids = self._tokenize(between.removesuffix(" "), special=True)
            self._suffix_ids = self._tokenize(tail, special=True)
        else:
            # llama.cpp's default layout (server-common.cpp, format_prompt_rerank).
            bos = llama_cpp.llama_vocab_bos(vocab)
            eos = llama_cpp.llama_vocab_eos(vocab)
            sep = llama_cpp.llama_vocab_sep(vocab)
            if eos < 0:
                eos = sep
            add_bos = llama_cpp.llama_vocab_get_add_bos(vocab) and bos >= 0
            add_eos = llama_cpp.llama_vocab_get_add_eos(vocab) and eos >= 0
            add_sep = llama_cpp.llama_vocab_get_add_sep(vocab) and sep >= 0
            self._head_ids = [bos] if add_bos else []
            self._between_ids = ([eos] if add_eos else []) + ([sep] if add_sep else [])
            self._suffix_ids = [eos] if add_eos else []
            self._query_space = self._doc_space = False
        fixed = len(self._head_ids) + len(self._between_ids) + len(self._suffix_ids)
        if max_length < fixed + 2:
            raise ValueError(
                f"max_length={max_length} leaves no room for a query and a document ({fixed} template tokens)"
            )
        # A query may take at most half the window, so a document always has room (Cohere's rule too).
        self._max_query_tokens = min(max_query_tokens, (max_length - fixed) // 2)

    # -- PromptTokenizer -------------------------------------------------------------------
    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def suffix_length(self) -> int:
        return len(self._suffix_ids)

    def item_room(self, shared_ids: Sequence[int]) -> int:
        return self._max_length - len(shared_ids) - len(self._suffix_ids)

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        query_ids = self._tokenize((" " if self._query_space else "") + query, special=False)
        return [*self._head(instruction), *query_ids[: self._max_query_tokens], *self._between_ids]

    def _head(self, instruction: str) -> list[int]:
        """The template's head with ``instruction`` in its instruction line (empty: the template's own)."""
        if self._instruct_at is None or not instruction or instruction == self.default_instruction:
            return self._head_ids
        ids = self._heads.get(instruction)
        if ids is None:
            a, b = self._instruct_at
            before = self._head_text[:a]
            # The space after "<Instruct>:" goes with the instruction, as with the query (BPE attaches
            # a space to the word after it); special-token parsing off for the request's text (it
            # cannot inject <|im_end|>), on for the template's.
            ids = [
                *self._tokenize(before.removesuffix(" "), special=True),
                *self._tokenize((" " if before.endswith(" ") else "") + instruction, special=False),
                *self._tokenize(self._head_text[b:], special=True),
            ]
            if len(self._heads) < 64:  # a few instructions per deployment; others are tokenized per request
                self._heads[instruction] = ids
        return ids

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        prefix = " " if self._doc_space else ""
        return [self._tokenize(prefix + d, special=False) for d in documents]

    def assemble(self, shared_ids: Sequence[int], item_ids: Sequence[int]) -> list[int]:
        return [*shared_ids, *item_ids, *self._suffix_ids]

    def _tokenize(self, text: str, *, special: bool) -> list[int]:
        if not text:
            return []
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))


_INSTRUCT, _QUERY_LINE = "<Instruct>: ", "\n<Query>:"


def _split_template(template: str) -> tuple[tuple[str, str], str]:
    """``A{query}B{document}C`` -> ((A, B), C); the shared part (A, query, B) must come first."""
    q, d = template.find("{query}"), template.find("{document}")
    if q < 0 or d < 0 or q > d:
        raise ValueError("the GGUF's rerank template must contain {query} before {document}")
    return (template[:q], template[q + len("{query}") : d]), template[d + len("{document}") :]
