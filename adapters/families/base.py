"""What a family gives the runtimes: its tokenizer, its model head and its score rule.

A runtime (``adapters.runtimes``) owns devices, batching, threads and engine processes; a
:class:`Family` owns everything model-specific. One class per family, one per runtime, never
one per combination: a runtime calls only the methods below.

Flow for one :class:`adapters.base.ScoreJob` (the service already tokenized, truncated and
chunked through ``family.tokenizer``):

1. ``rows(job)``: the token rows the model must run (a prompt per item; a bi-encoder adds the
   query as its own row).
2. transformers: ``forward(rows)`` on length-sorted batches gives one output vector per row;
   vLLM: each row is a request (``vllm_request``) whose pooled output is that vector.
3. ``scores(job, outputs)``: one score per item, in [0, 1], or raw when ``job.raw_scores``.

Imports only the standard library here; family modules import torch, runtimes import them
lazily (``adapters.families.load_family_class``).
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from adapters.base import EngineConfigError, PromptTokenizer, ScoreJob
from adapters.families.detect import Detection, ModelFiles
from schemas.config import LocalModelConfig

if TYPE_CHECKING:
    import torch

__all__ = ("WEIGHTS_LOCK", "Family", "Row")

# Held while a model's weights load (``Family.load_torch``, the packed runtime's backbone):
# transformers' from_pretrained is not thread-safe for checkpoints with tied embeddings
# (transformers 5.19: of three tied Qwen2 models loaded in parallel threads, some failed with
# "Cannot copy out of meta tensor; no data!"). The gateway loads its models in parallel.
WEIGHTS_LOCK = threading.Lock()


class Row(NamedTuple):
    """One sequence the model runs."""

    ids: list[int]
    # Where token type 1 starts (BERT's second segment); None when the model has no token types.
    segment_start: int | None = None


class Family(abc.ABC):
    """One model family; instantiated per model start with the resolved files and config."""

    name: ClassVar[str]
    # True when the model has a meaningful raw output (a logit, a cosine) besides the [0, 1] score.
    supports_raw_scores: ClassVar[bool] = False
    # True for listwise families whose model tokenizes itself (jina-v3): the runtime gives them
    # texts through ``score_block`` in blocks of ``block_size``, and exposes no tokenizer.
    takes_texts: ClassVar[bool] = False

    def __init__(self, config: LocalModelConfig, files: ModelFiles, detection: Detection) -> None:
        self.config = config
        self.files = files
        self.detection = detection

    # -- tokens (both runtimes) ------------------------------------------------------------
    @property
    @abc.abstractmethod
    def tokenizer(self) -> PromptTokenizer:
        """Valid after ``load_tokenizer``."""

    @abc.abstractmethod
    def load_tokenizer(self) -> PromptTokenizer:
        """Load the tokenizer (blocking; worker thread). Raises ValueError for a window too small."""

    @abc.abstractmethod
    def rows(self, job: ScoreJob) -> list[Row]:
        """The sequences to run for ``job``."""

    @abc.abstractmethod
    def scores(self, job: ScoreJob, outputs: Sequence[Sequence[float]] | torch.Tensor) -> list[float]:
        """One score per item from the per-row outputs (rows order)."""

    def window(self) -> int:
        """Tokens per sequence: the configured ``max_length`` capped at the checkpoint's window."""
        return self.config.max_length

    # -- transformers runtime ----------------------------------------------------------------
    # A family that does not run on a runtime keeps these defaults; FAMILY_RUNTIMES refuses such
    # a combination at config check, so reaching one is a config the check did not know about.
    def load_torch(self, device: torch.device, dtype: torch.dtype) -> None:
        raise EngineConfigError(f"family {self.name!r} does not run on transformers")

    def forward(self, rows: list[Row]) -> torch.Tensor:
        """(len(rows), k) float32 outputs of one padded batch (worker thread, inference mode)."""
        raise EngineConfigError(f"family {self.name!r} does not run on transformers")

    def unload(self) -> None:
        """Drop the weights (the runtime empties the device cache)."""

    # -- vLLM pooling runner -----------------------------------------------------------------
    def vllm_runner_args(self) -> dict[str, Any]:
        """Engine args this family needs on vLLM's pooling runner (hf_overrides, prefix caching...)."""
        raise EngineConfigError(f"family {self.name!r} does not run on vLLM's pooling runner")

    def vllm_extra_kwargs(self, row: Row) -> dict[str, Any] | None:
        """PoolingParams.extra_kwargs for ``row`` (e.g. where token type 1 starts)."""
        return None

    def vllm_scores(self, job: ScoreJob, outputs: Sequence[Sequence[float]]) -> list[float]:
        """Scores from vLLM's pooled outputs, asked WITHOUT vLLM's activation: ours applies once."""
        return self.scores(job, outputs)
