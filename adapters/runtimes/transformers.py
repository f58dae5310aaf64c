"""Qwen3-Reranker on Hugging Face transformers (CPU or CUDA), in-process.

Only what the score needs is computed: the backbone's hidden state at the last position and
the two LM-head rows for "no" and "yes" (never 151,669-way logits at every position, which is
what makes naive deployments run out of memory). Items are sorted by length and packed into
left-padded batches bounded by a padded-token budget; each forward pass runs in a worker thread
behind a capacity limiter so the event loop keeps serving.

Imported only through ``adapters.registry``: importing it pulls in torch and transformers.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import torch

from adapters.base import EngineObserver, EngineUnavailableError, ScoreJob, ScoreResult
from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
from schemas.config import TransformersEngineConfig

__all__ = ("TransformersQwen3Engine", "plan_batches")


def plan_batches(lengths: Sequence[int], *, batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Group item indices into length-sorted batches.

    A batch's padded cost is ``longest x rows``; it stays within ``batch_tokens`` (an item
    longer than the budget gets a batch of its own) and ``max_batch_size`` rows.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted descending: a batch's first item is its longest, so it sets the padded width.
        full = len(current) >= max_batch_size
        if current and (full or (len(current) + 1) * lengths[current[0]] > batch_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class TransformersQwen3Engine:
    """:class:`adapters.base.RerankEngine` for a Qwen3-Reranker checkpoint on transformers."""

    def __init__(self, config: TransformersEngineConfig) -> None:
        self._config = config
        self._prompt: Qwen3PromptTokenizer | None = None
        self._backbone: Any = None
        self._head: torch.Tensor | None = None  # (2, hidden) fp32 rows: [no, yes]
        self._device: torch.device | None = None
        self._limiter = anyio.CapacityLimiter(config.max_parallel_batches)
        self.observer: EngineObserver | None = None
        # Jobs that called score() and have not started their first forward pass yet; the
        # worker thread that starts a job's first pass takes it off, under this lock.
        self.queued_jobs = 0
        self._queue_lock = threading.Lock()

    @property
    def tokenizer(self) -> Qwen3PromptTokenizer | None:
        return self._prompt

    @property
    def device(self) -> str:
        return str(self._device) if self._device is not None else "unloaded"

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._load)

    async def stop(self) -> None:
        self._backbone = self._head = self._prompt = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def check_health(self) -> None:
        if self._backbone is None:
            raise EngineUnavailableError("model is not loaded")

    async def score(self, job: ScoreJob) -> ScoreResult:
        prompt, backbone = self._prompt, self._backbone
        if prompt is None or backbone is None:
            raise EngineUnavailableError("model is not loaded")
        prompts = [prompt.assemble(job.shared_ids, item) for item in job.item_ids]
        scores = [math.nan] * len(prompts)
        batches = plan_batches(
            [len(p) for p in prompts],
            batch_tokens=self._config.batch_tokens,
            max_batch_size=self._config.max_batch_size,
        )
        # Time between handing a batch to the limiter and its thread starting is queueing
        # (another request's forward pass holds the slot), not engine work.
        queue_s = 0.0
        waiting = [True]  # shared with the worker threads: cleared when the first pass starts
        with self._queue_lock:
            self.queued_jobs += 1
        try:
            for batch in batches:
                rows = [prompts[i] for i in batch]
                submitted = time.perf_counter()
                started, out = await anyio.to_thread.run_sync(
                    self._timed_forward, rows, waiting, limiter=self._limiter
                )
                queue_s += max(0.0, started - submitted)
                if self.observer is not None:
                    # Padded tokens: what the forward pass really computed.
                    self.observer.step(rows=len(rows), tokens=len(rows) * max(map(len, rows)))
                for i, s in zip(batch, out, strict=True):
                    scores[i] = s
        finally:
            self._leave_queue(waiting)  # cancelled (or empty) before any pass started
        return ScoreResult(scores=scores, input_tokens=sum(len(p) for p in prompts), queue_s=queue_s)

    def queue_depth(self) -> int:
        """Requests waiting for their first forward pass (``rerank_queued_requests``)."""
        return self.queued_jobs

    # -- worker-thread code ----------------------------------------------------------------
    def _load(self) -> None:
        from transformers import AutoModelForCausalLM

        cfg = self._config
        device = _resolve_device(cfg.device)
        dtype = _resolve_dtype(cfg.dtype, device)
        tokenizer = load_hf_tokenizer(cfg.path, cfg.revision)
        prompt = Qwen3PromptTokenizer(
            tokenizer, max_length=cfg.max_length, max_query_tokens=cfg.max_query_tokens
        )
        model = AutoModelForCausalLM.from_pretrained(cfg.path, revision=cfg.revision, dtype=dtype)
        model.eval()
        lm_head = model.get_output_embeddings().weight
        # Keep the two rows the score needs, in fp32 (the head is tiny; fp32 keeps scores stable).
        head = lm_head[[prompt.no_id, prompt.yes_id]].detach().to(device=device, dtype=torch.float32)
        backbone = getattr(model, model.base_model_prefix)
        backbone.to(device)
        del model  # drops the full-vocabulary LM head unless tied to the embeddings
        self._device, self._head, self._backbone, self._prompt = device, head, backbone, prompt

    def _leave_queue(self, waiting: list[bool]) -> None:
        with self._queue_lock:
            if waiting[0]:
                waiting[0] = False
                self.queued_jobs -= 1

    def _timed_forward(self, rows: list[list[int]], waiting: list[bool]) -> tuple[float, list[float]]:
        started = time.perf_counter()
        self._leave_queue(waiting)
        return started, self._forward(rows)

    @torch.inference_mode()
    def _forward(self, rows: list[list[int]]) -> list[float]:
        assert self._head is not None and self._device is not None
        width = max(len(r) for r in rows)
        pad = 0
        # Left padding puts every row's last token at position -1.
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
        # Positions count real tokens only, so a padded row computes exactly what it would alone.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self._backbone(
            input_ids=input_ids.to(self._device),
            attention_mask=mask.to(self._device),
            position_ids=positions.to(self._device),
            use_cache=False,
        ).last_hidden_state[:, -1, :]
        logits = hidden.float() @ self._head.T  # (rows, 2): [no, yes]
        return torch.softmax(logits, dim=-1)[:, 1].tolist()


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32
