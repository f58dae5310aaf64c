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
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from adapters.base import EngineConfigError, ScoreJob
from adapters.families.base import Family, Row

if TYPE_CHECKING:
    import torch

__all__ = ("PREFIX", "SUFFIX", "Qwen3Family", "Qwen3PromptTokenizer", "load_hf_tokenizer", "max_position_embeddings", "render_prompt")

PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
YES, NO = "yes", "no"


def render_prompt(instruction: str, query: str, document: str) -> str:
    """The whole prompt as one string: the reference the token pieces must reproduce."""
    return f"{PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{SUFFIX}"


class Qwen3PromptTokenizer:
    """Token pieces of the Qwen3 prompt over a Hugging Face fast tokenizer.

    Implements :class:`adapters.base.PromptTokenizer`. Thread-safe for reads: the HF fast
    tokenizer's batch encode runs in Rust (in parallel) and we keep no mutable state beyond an
    LRU cache of instruction heads.
    """

    def __init__(self, tokenizer: Any, *, max_length: int, max_query_tokens: int) -> None:
        self._tok = tokenizer
        # The Rust tokenizer under the HF wrapper: calling it directly skips building a
        # BatchEncoding, and `encode_batch_fast` (tokenizers >= 0.21) skips character offsets we
        # never read: about 1.5x faster for 100 documents of ~100 tokens (2-core CPU box).
        # The HF wrapper resets truncation and padding before each of its own calls; we do it
        # once, so a tokenizer.json that ships either cannot cut or pad our pieces.
        self._rust = tokenizer.backend_tokenizer
        self._rust.no_truncation()
        self._rust.no_padding()
        self._encode_batch = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)
        self._max_length = max_length
        self._max_query_tokens = max_query_tokens
        self._suffix_ids: list[int] = self._encode(SUFFIX)
        self.yes_id = self._single_token_id(YES)
        self.no_id = self._single_token_id(NO)
        # The instruction head repeats across requests: cache it per instruction.
        self._head = functools.lru_cache(maxsize=256)(self._encode_head)
        min_room = len(self._encode_head("x")) + max_query_tokens + len(self._suffix_ids) + 16
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

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        query_ids = self._encode(f" {query}")
        if len(query_ids) > self._max_query_tokens:
            # Cut in token space, then re-tokenize the kept text with its continuation so the
            # result is exactly what a full-string tokenization of the truncated query gives.
            query = self._tok.decode(query_ids[: self._max_query_tokens])[1:]
        return self._head(instruction) + self._encode(f" {query}\n<Document>:")

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        if not documents:
            return []
        return [enc.ids for enc in self._encode_batch([f" {d}" for d in documents], add_special_tokens=False)]

    # -- helpers ---------------------------------------------------------------------------
    def assemble(self, shared_ids: Sequence[int], item_ids: Sequence[int]) -> list[int]:
        return [*shared_ids, *item_ids, *self._suffix_ids]

    def _encode_head(self, instruction: str) -> list[int]:
        return self._encode(f"{PREFIX}<Instruct>: {instruction}\n<Query>:")

    def _encode(self, text: str) -> list[int]:
        return self._rust.encode(text, add_special_tokens=False).ids

    def _single_token_id(self, word: str) -> int:
        ids = self._encode(word)
        if len(ids) != 1:
            raise EngineConfigError(f"tokenizer does not encode {word!r} as one token: {ids}")
        return ids[0]


def load_hf_tokenizer(path: str, revision: str | None = None) -> Any:
    """Load the checkpoint's fast tokenizer (the Rust one: batch encode runs in parallel)."""
    # The fast tokenizer parallelizes batches itself; silence its fork warning in workers.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, revision=revision, use_fast=True)
    if not getattr(tok, "is_fast", False):
        raise EngineConfigError(f"{path}: no fast tokenizer (tokenizer.json) found")
    return tok


class Qwen3Family(Family):
    """Qwen3-Reranker: the yes/no prompt; score = softmax([no, yes])[1] at the last position.

    On transformers only what the score needs is computed: the backbone's hidden state at the
    last position and the two LM-head rows for "no" and "yes" (never 151,669-way logits at every
    position, which is what makes naive deployments run out of memory), on left-padded rows.
    """

    name = "qwen3"

    _prompt: Qwen3PromptTokenizer | None = None
    _backbone: Any = None
    _head: Any = None  # (2, hidden) fp32 rows: [no, yes]
    _device: Any = None

    @property
    def tokenizer(self) -> Qwen3PromptTokenizer:
        assert self._prompt is not None, "load_tokenizer first"
        return self._prompt

    def load_tokenizer(self) -> Qwen3PromptTokenizer:
        cfg = self.config
        tokenizer = load_hf_tokenizer(cfg.path, cfg.revision)
        self._prompt = Qwen3PromptTokenizer(tokenizer, max_length=cfg.max_length, max_query_tokens=cfg.max_query_tokens)
        return self._prompt

    def rows(self, job: ScoreJob) -> list[Row]:
        prompt = self.tokenizer
        return [Row(prompt.assemble(job.shared_ids, item)) for item in job.item_ids]

    def scores(self, job: ScoreJob, outputs: Any) -> list[float]:
        import torch

        logits = torch.as_tensor(outputs, dtype=torch.float32)  # (rows, 2): [no, yes]
        return torch.softmax(logits, dim=-1)[:, 1].tolist()

    # -- transformers --------------------------------------------------------------------------
    def load_torch(self, device: torch.device, dtype: torch.dtype) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        cfg, prompt = self.config, self.tokenizer
        model = AutoModelForCausalLM.from_pretrained(cfg.path, revision=cfg.revision, dtype=dtype,
                                                     **attention_override(device, dtype))
        model.eval()
        lm_head = model.get_output_embeddings().weight
        # Keep the two rows the score needs, in fp32 (the head is tiny; fp32 keeps scores stable).
        self._head = lm_head[[prompt.no_id, prompt.yes_id]].detach().to(device=device, dtype=torch.float32)
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
        return hidden.float() @ self._head.T  # (rows, 2): [no, yes]

    def unload(self) -> None:
        self._backbone = self._head = None

    # -- vLLM ----------------------------------------------------------------------------------
    def vllm_runner_args(self) -> dict[str, Any]:
        # vLLM's documented online conversion of the original checkpoint into a classifier whose
        # one output is the yes-minus-no logit (sigmoid of it = softmax([no, yes])[1]).
        return {
            "runner": "pooling",
            "hf_overrides": {
                "architectures": ["Qwen3ForSequenceClassification"],
                "classifier_from_token": ["no", "yes"],
                "is_original_qwen3_reranker": True,
            },
        }

    def vllm_scores(self, job: ScoreJob, outputs: Any) -> list[float]:
        import torch

        logits = torch.as_tensor(outputs, dtype=torch.float32).reshape(len(outputs), -1)
        if logits.shape[1] != 1:
            raise ValueError(f"vLLM classifier returned {logits.shape[1]} values, expected 1 (yes - no)")
        return torch.sigmoid(logits[:, 0]).tolist()


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


def max_position_embeddings(path: str, revision: str | None = None) -> int | None:
    """The checkpoint's ``max_position_embeddings`` (local directory or hub cache), or None."""
    from transformers import AutoConfig

    value = getattr(AutoConfig.from_pretrained(path, revision=revision), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None
