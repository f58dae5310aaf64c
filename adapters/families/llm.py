"""LLM rerankers: a causal LM, its card's prompt, and a score read from one or two tokens' logits.

One family class for every such model; a model is a :class:`schemas.config.LlmRerankerSpec`
(``schemas.config.LLM_RERANKERS``: Qwen3-Reranker, bge-reranker-v2-gemma, mxbai-rerank-v2).
The prompt is built in token space from pieces, each tokenized on its own as the cards do, so
that documents can be truncated and chunked without cutting the suffix, and so that the part
one request shares comes first and is tokenized once:

- shared: ``[BOS] head(instruction) query middle`` -- and, when the tail names the instruction
  (Gemma's prompt comes after the passage), ``tail(instruction)`` too: the service counts it
  against the window with the rest of what a request shares; ``assemble`` puts it back after
  the document.
- document: ``document`` with the text (one piece per chunk; labels such as ``B:`` sit in
  ``middle``, so every chunk of a long document keeps its label -- unless the tokenizer merges
  across that cut, checked at load on a few probes: then the label is glued to each document,
  as the card tokenizes it).
- suffix: the tail, when it does not depend on the instruction.

On transformers only what the score needs is computed: the backbone's hidden state at the last
position and the LM-head rows of the score tokens (never vocabulary-wide logits at every
position, which is what makes naive deployments run out of memory), on left-padded rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from adapters.base import EngineConfigError, EngineError, ScoreJob
from adapters.families.base import Family, Row
from adapters.families.layout import prepare_rust_tokenizers
from adapters.families.split_encode import SplitEncoder, resolve_tokenize_threads
from schemas.config import LLM_RERANKERS, LlmRerankerSpec

if TYPE_CHECKING:
    import torch

__all__ = (
    "BgeGemmaFamily",
    "LlmPromptTokenizer",
    "LlmRerankerFamily",
    "MxbaiV2Family",
    "attention_override",
    "load_hf_tokenizer",
    "max_position_embeddings",
)

_INSTRUCTION = "{instruction}"
# Document starts that stress a label/document cut: words, punctuation, spaces, newlines, digits.
_SPLIT_PROBES = ("x", "The capital is Paris.", "(see above)", "  two spaces", "\nnew line", "1990", "'Yes'")


class LlmPromptTokenizer:
    """Token pieces of an LLM reranker's prompt over a Hugging Face fast tokenizer.

    Implements :class:`adapters.base.PromptTokenizer`. Thread-safe for reads: the HF fast
    tokenizer's batch encode runs in Rust (in parallel) and we keep no mutable state beyond LRU
    caches of the instruction pieces.
    """

    def __init__(
        self,
        tokenizer: Any,
        spec: LlmRerankerSpec,
        *,
        max_length: int,
        max_query_tokens: int,
        tokenize_threads: int | str = 1,
    ) -> None:
        self._tok = tokenizer
        self.spec = spec
        # The instruction used when neither the request nor the config names one.
        self.default_instruction = spec.default_instruction
        # The Rust tokenizer under the HF wrapper: calling it directly skips building a
        # BatchEncoding, and `encode_batch_fast` (tokenizers >= 0.21) skips character offsets we
        # never read: about 1.5x faster for 100 documents of ~100 tokens (2-core CPU box).
        # The HF wrapper resets truncation and padding before each of its own calls; we do it
        # once, so a tokenizer.json that ships either cannot cut or pad our pieces.
        self._rust = tokenizer.backend_tokenizer
        self._rust.no_truncation()
        self._rust.no_padding()
        self._encode_batch = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)
        self._split = SplitEncoder(self._encode_batch, resolve_tokenize_threads(tokenize_threads))
        self._max_length = max_length
        self._max_query_tokens = max_query_tokens
        self._query_before, _, self._query_after = spec.query.partition("{query}")
        self._doc_before, _, self._doc_after = spec.document.partition("{document}")
        self._bos: list[int] = []
        if spec.bos:
            if tokenizer.bos_token_id is None:
                raise EngineConfigError("the prompt starts with BOS but the tokenizer names no bos_token")
            self._bos = [int(tokenizer.bos_token_id)]
        middle = list(spec.middle)
        if middle and not self._splits_exactly(middle[-1]):
            # The card tokenizes label and document as one piece ("B: {passage}") and this
            # tokenizer merges across the cut: glue the label to each document instead (exact
            # for whole documents; chunks after a document's first then carry no label).
            self._doc_before = middle.pop() + self._doc_before
        self._middle = [i for piece in middle for i in self._encode(piece)]
        # A tail that names the instruction travels in the shared part (see the module docstring).
        self._tail_in_shared = any(_INSTRUCTION in piece for piece in spec.tail)
        self._suffix_ids: list[int] = [] if self._tail_in_shared else self._encode_tail("")
        self.yes_id = self._single_token_id(spec.yes_token)
        self.no_id = self._single_token_id(spec.no_token) if spec.no_token is not None else None
        # The instruction pieces repeat across requests: cache them per instruction.
        self._head = functools.lru_cache(maxsize=256)(self._encode_head)
        self._tail = functools.lru_cache(maxsize=256)(self._encode_tail)
        tail_room = len(self._encode_tail("x")) if self._tail_in_shared else 0
        fixed = len(self._encode_head("x")) + len(self._middle) + tail_room + len(self._suffix_ids)
        min_room = fixed + max_query_tokens + 16
        if max_length < min_room:
            raise EngineConfigError(
                f"max_length={max_length} leaves no room for documents: the template, a "
                f"{max_query_tokens}-token query and the suffix take about {min_room} tokens; "
                "raise max_length or lower max_query_tokens"
            )

    # -- PromptTokenizer -------------------------------------------------------------------
    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def suffix_length(self) -> int:
        return len(self._suffix_ids)

    def item_room(self, shared_ids: Sequence[int]) -> int:
        return self._max_length - len(shared_ids) - len(self._suffix_ids)

    @property
    def suffix_ids(self) -> list[int]:
        return self._suffix_ids

    @property
    def score_token_ids(self) -> list[int]:
        """LM-head rows the score reads, in the order ``scores`` expects: [no, yes] or [yes]."""
        return [self.yes_id] if self.no_id is None else [self.no_id, self.yes_id]

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        before = self._query_before
        query_ids = self._encode(before + query)
        if len(query_ids) > self._max_query_tokens:
            # Cut in token space, then re-tokenize the kept text with its continuation so the
            # result is exactly what a full-string tokenization of the truncated query gives.
            text = self._tok.decode(query_ids[: self._max_query_tokens])
            # A cut inside a character's bytes (byte-level BPE: an emoji is several tokens) decodes
            # to U+FFFD, which is no part of the query: drop such a partial character.
            while text.endswith("\ufffd") and not (before + query).startswith(text):
                text = text[:-1]
            query = text.removeprefix(before)
        shared = self._head(instruction) + self._encode(before + query + self._query_after) + self._middle
        return shared + self._tail(instruction) if self._tail_in_shared else shared

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        if not documents:
            return []
        texts = [f"{self._doc_before}{d}{self._doc_after}" for d in documents]
        return self._split(texts)

    # -- helpers ---------------------------------------------------------------------------
    def assemble(self, shared_ids: Sequence[int], item_ids: Sequence[int], instruction: str | None = None) -> list[int]:
        """The whole prompt of one item; ``instruction`` is the job's (needed when the tail names it)."""
        if not self._tail_in_shared:
            return [*shared_ids, *item_ids, *self._suffix_ids]
        tail = self._tail(instruction if instruction is not None else self.default_instruction)
        cut = len(shared_ids) - len(tail)
        if cut < 0 or list(shared_ids[cut:]) != tail:
            raise EngineError("the job's shared tokens do not end with its instruction's tail")
        return [*shared_ids[:cut], *item_ids, *tail]

    def _fill(self, piece: str, instruction: str) -> str:
        if _INSTRUCTION not in piece:
            return piece
        written = self.spec.instruction_format.replace(_INSTRUCTION, instruction) if instruction else ""
        return piece.replace(_INSTRUCTION, written)

    def _encode_head(self, instruction: str) -> list[int]:
        return self._bos + [i for piece in self.spec.head for i in self._encode(self._fill(piece, instruction))]

    def _encode_tail(self, instruction: str) -> list[int]:
        return [i for piece in self.spec.tail for i in self._encode(self._fill(piece, instruction))]

    def _encode(self, text: str) -> list[int]:
        return self._rust.encode(text, add_special_tokens=False).ids if text else []

    def _splits_exactly(self, label: str) -> bool:
        """Whether ``label`` and a document tokenized apart give the ids of them tokenized together."""
        for probe in _SPLIT_PROBES:
            text = f"{self._doc_before}{probe}{self._doc_after}"
            if self._encode(label) + self._encode(text) != self._encode(label + text):
                return False
        return True

    def _single_token_id(self, word: str) -> int:
        ids = self._encode(word)
        if len(ids) != 1:
            raise EngineConfigError(f"tokenizer does not encode {word!r} as one token: {ids}")
        return ids[0]


def load_hf_tokenizer(path: str, revision: str | None = None) -> Any:
    """Load the checkpoint's fast tokenizer (the Rust one: batch encode runs in parallel)."""
    # The fast tokenizer parallelizes batches itself (silences its fork warning in workers too).
    prepare_rust_tokenizers()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, revision=revision, use_fast=True)
    if not getattr(tok, "is_fast", False):
        raise EngineConfigError(f"{path}: no fast tokenizer (tokenizer.json) found")
    return tok


class LlmRerankerFamily(Family):
    """A causal-LM reranker (``spec``): score = softmax([no, yes])[1], or sigmoid(yes), at the last position."""

    spec: ClassVar[LlmRerankerSpec]
    prompt_class: ClassVar[type[LlmPromptTokenizer]] = LlmPromptTokenizer

    _prompt: LlmPromptTokenizer | None = None
    _backbone: Any = None
    _head: Any = None  # (k, hidden) fp32 rows: [no, yes] or [yes]
    _device: Any = None

    @property
    def tokenizer(self) -> LlmPromptTokenizer:
        assert self._prompt is not None, "load_tokenizer first"
        return self._prompt

    def load_tokenizer(self) -> LlmPromptTokenizer:
        cfg = self.config
        tokenizer = load_hf_tokenizer(cfg.path, cfg.revision)
        self._prompt = self._make_prompt(
            tokenizer,
            max_length=cfg.max_length,
            max_query_tokens=cfg.max_query_tokens,
            tokenize_threads=cfg.tokenize_threads,
        )
        return self._prompt

    def _make_prompt(
        self, tokenizer: Any, *, max_length: int, max_query_tokens: int, tokenize_threads: int | str = 1
    ) -> LlmPromptTokenizer:
        return LlmPromptTokenizer(
            tokenizer,
            self.spec,
            max_length=max_length,
            max_query_tokens=max_query_tokens,
            tokenize_threads=tokenize_threads,
        )

    def rows(self, job: ScoreJob) -> list[Row]:
        prompt = self.tokenizer
        return [Row(prompt.assemble(job.shared_ids, item, job.instruction)) for item in job.item_ids]

    def scores(self, job: ScoreJob, outputs: Any) -> list[float]:
        import torch

        logits = torch.as_tensor(outputs, dtype=torch.float32)  # (rows, 2): [no, yes], or (rows, 1): [yes]
        if job.raw_scores:  # the cards' unnormalized output: logit(yes), or logit(yes) - logit(no)
            return (logits[:, 0] if logits.shape[-1] == 1 else logits[:, 1] - logits[:, 0]).tolist()
        if logits.shape[-1] == 1:
            return torch.sigmoid(logits[:, 0]).tolist()
        return torch.softmax(logits, dim=-1)[:, 1].tolist()

    # -- transformers --------------------------------------------------------------------------
    def load_torch(self, device: torch.device, dtype: torch.dtype) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        cfg, prompt = self.config, self.tokenizer
        model = AutoModelForCausalLM.from_pretrained(
            cfg.path, revision=cfg.revision, dtype=dtype, **attention_override(device, dtype)
        )
        model.eval()
        lm_head = model.get_output_embeddings().weight
        # Keep the rows the score needs, in fp32 (the head is tiny; fp32 keeps scores stable).
        self._head = lm_head[prompt.score_token_ids].detach().to(device=device, dtype=torch.float32)
        backbone = getattr(model, model.base_model_prefix)
        backbone.to(device)
        del model  # drops the full-vocabulary LM head unless tied to the embeddings
        self._device, self._backbone = device, backbone

    def forward(self, rows: list[Row]) -> torch.Tensor:
        import torch

        width = max(len(r.ids) for r in rows)
        pad = 0
        # Left padding puts every row's last token at position -1.
        input_ids = torch.tensor([[pad] * (width - len(r.ids)) + r.ids for r in rows], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r.ids)) + [1] * len(r.ids) for r in rows], dtype=torch.long)
        # Positions count real tokens only, so a padded row computes exactly what it would alone.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self._backbone(
            input_ids=input_ids.to(self._device),
            attention_mask=mask.to(self._device),
            position_ids=positions.to(self._device),
            use_cache=False,
        ).last_hidden_state[:, -1, :]
        return hidden.float() @ self._head.T  # (rows, k): [no, yes] or [yes]

    def unload(self) -> None:
        self._backbone = self._head = None

    # -- vLLM ----------------------------------------------------------------------------------
    def vllm_runner_args(self) -> dict[str, Any]:
        # vLLM's documented online conversion of the original checkpoint into a classifier whose
        # one output is the yes-minus-no logit (sigmoid of it = softmax([no, yes])[1]), or the
        # yes logit itself (Gemma: sigmoid of it is the card's normalized score).
        return {"runner": "pooling", "hf_overrides": dict(self.spec.vllm_hf_overrides)}

    def vllm_scores(self, job: ScoreJob, outputs: Any) -> list[float]:
        import torch

        logits = torch.as_tensor(outputs, dtype=torch.float32).reshape(len(outputs), -1)
        if logits.shape[1] != 1:
            raise ValueError(f"vLLM classifier returned {logits.shape[1]} values, expected 1 (yes - no, or yes)")
        return (logits[:, 0] if job.raw_scores else torch.sigmoid(logits[:, 0])).tolist()


class BgeGemmaFamily(LlmRerankerFamily):
    """BAAI/bge-reranker-v2-gemma: Gemma, the "Yes" logit after the card's A/B prompt."""

    name = "bge-reranker-v2-gemma"
    spec = LLM_RERANKERS[name]
    supports_raw_scores = True  # logit("Yes"): the card's compute_score(normalize=False)


class MxbaiV2Family(LlmRerankerFamily):
    """mixedbread-ai/mxbai-rerank-{base,large}-v2: Qwen2, logit("1") - logit("0") after its chat prompt."""

    name = "mxbai-rerank-v2"
    spec = LLM_RERANKERS[name]
    supports_raw_scores = True  # logit("1") - logit("0"): MxbaiRerankV2.predict's output


def attention_override(device: Any, dtype: Any) -> dict[str, str]:
    """fp32 on CUDA: eager attention instead of SDPA.

    Measured on an H200 (torch 2.11, docs/benchmarks/gpu-h200-2026-12-01-b): on left-padded fp32
    batches CUDA's fused SDPA kernels scored one document of 200 0.44 away from the reference
    (0.518 vs 0.961), while the same engine with SDPA's math kernel only was within 4e-7. bf16
    (the GPU default) and the CPU were right; fp32 on a GPU is a parity setting, where exactness
    matters more than attention speed.
    """
    import torch

    if torch.device(device).type == "cuda" and dtype == torch.float32:
        return {"attn_implementation": "eager"}
    return {}


def max_position_embeddings(path: str, revision: str | None = None, *, trust_remote_code: bool = False) -> int | None:
    """The checkpoint's ``max_position_embeddings`` (local directory or hub cache), or None."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None
