"""The llama.cpp engine: the model loaded with rank pooling, bounded decode batches run one at a
time on a worker thread, and the head's outputs turned into scores as llama.cpp's graph means them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread

from adapters.base import EngineError, EngineUnavailableError, ScoreJob, ScoreResult
from adapters.runtimes.gguf.metadata import GgufInfo, check_rerank_head, inspect_gguf
from adapters.runtimes.gguf.prompt import GgufPromptTokenizer
from schemas.config import GgufEngineConfig

# Without a --max_length, prompts are capped like the other local engines' default.
_DEFAULT_WINDOW = 8192


def plan_decodes(lengths: Sequence[int], *, batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Group prompts (by index, input order) into llama_decode calls within both bounds."""
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if current and (tokens + n > batch_tokens or len(current) >= max_batch_size):
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        batches.append(current)
    return batches


class GgufEngine:
    """:class:`adapters.base.RerankEngine` for a GGUF reranker on llama.cpp."""

    runtime = "gguf"

    def __init__(self, config: GgufEngineConfig) -> None:
        self._config = config
        self._info: GgufInfo | None = None
        self._llm: Any = None
        self._prompt: GgufPromptTokenizer | None = None
        self._batch: Any = None
        self._n_batch = 0
        # One llama_decode at a time: a llama.cpp context is not thread-safe.
        self._limiter = anyio.CapacityLimiter(1)

    @property
    def tokenizer(self) -> GgufPromptTokenizer | None:
        return self._prompt if self._llm is not None else None

    @property
    def supports_raw_scores(self) -> bool:
        # Qwen3's rank output is already a probability: there is no logit to return.
        return self._info is not None and self._info.family == "cross-encoder"

    def describe(self) -> dict[str, str]:
        """Family, runtime, device and dtype for /ready and /v1/models."""
        cfg = self._config
        out = {
            "runtime": self.runtime,
            "device": "cpu" if cfg.n_gpu_layers == 0 else f"gpu ({cfg.n_gpu_layers} layers)",
        }
        info = self._info
        if info is not None:
            out["dtype"] = info.file_type
            out["family"] = info.family
            out["family_reason"] = f"GGUF general.architecture = {info.architecture!r}, rank pooling"
        else:
            out["family"] = cfg.family
        return out

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._load)

    async def stop(self) -> None:
        llm, self._llm, self._prompt = self._llm, None, None
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.close()
        if llm is not None:
            await anyio.to_thread.run_sync(llm.close, limiter=self._limiter)

    async def check_health(self) -> None:
        if self._llm is None:
            raise EngineUnavailableError("model is not loaded")

    async def score(self, job: ScoreJob) -> ScoreResult:
        prompt, info = self._prompt, self._info
        if prompt is None or info is None or self._llm is None:
            raise EngineUnavailableError("model is not loaded")
        prompts = [prompt.assemble(job.shared_ids, item) for item in job.item_ids]
        outputs: list[list[float]] = [[] for _ in prompts]
        # Batches are planned at batch_tokens, not at the context's size: every sequence of one
        # llama_decode attends over the whole batch's KV cells (masked), so the attention cost
        # grows with the square of a batch's tokens. A prompt longer than batch_tokens (up to the
        # window, which n_ctx always holds) is decoded alone.
        for batch in plan_decodes(
            [len(p) for p in prompts],
            batch_tokens=self._config.batch_tokens,
            max_batch_size=self._config.max_batch_size,
        ):
            out = await anyio.to_thread.run_sync(self._decode, [prompts[i] for i in batch], limiter=self._limiter)
            for i, vec in zip(batch, out, strict=True):
                outputs[i] = vec
        scores = [_score(vec, info, raw=job.raw_scores) for vec in outputs]
        return ScoreResult(scores=scores, input_tokens=sum(len(p) for p in prompts))

    # -- worker-thread code ----------------------------------------------------------------
    def _load(self) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaBatch

        cfg = self._config
        if not os.path.isfile(cfg.path):
            # A ValueError, not an OSError: the hub download hint of other engines does not apply.
            raise ValueError(f"{cfg.path}: no such file; engine 'gguf' needs the path of a local .gguf file")
        info = inspect_gguf(cfg.path)
        check_rerank_head(info)
        if cfg.family != "auto" and cfg.family != info.family:
            raise ValueError(
                f"{cfg.path} is a {info.family} GGUF (architecture {info.architecture!r}), not {cfg.family!r}; "
                'set family = "auto" or the matching family'
            )
        if info.family == "cross-encoder" and (info.token_type_count or 0) > 1:
            # llama.cpp's BERT graph adds token type 0 to every token ("token types are hardcoded
            # to zero"): a pair model trained with type 1 on the document would score otherwise.
            raise ValueError(
                f"{cfg.path}: this cross-encoder has {info.token_type_count} token types (BERT pairs: type 1 on the "
                "document) and llama.cpp gives every token type 0, so its scores would differ from the checkpoint's; "
                "serve the checkpoint with engine = 'transformers' (or 'packed', 'openvino', 'vllm-score')"
            )
        if cfg.raw_scores and info.family != "cross-encoder":
            raise ValueError("raw_scores: this GGUF's rank output is already a probability (Qwen3); it has no logit")
        if cfg.n_gpu_layers != 0 and not llama_cpp.llama_supports_gpu_offload():
            raise ValueError(
                "n_gpu_layers is set but this llama-cpp-python build has no GPU support; reinstall it with "
                "CMAKE_ARGS='-DGGML_CUDA=on' pip install --no-binary llama-cpp-python llama-cpp-python, or set n_gpu_layers = 0"
            )
        trained = info.context_length or _DEFAULT_WINDOW
        window = min(cfg.max_length or _DEFAULT_WINDOW, trained)
        # An encoder must see a whole prompt in one micro-batch: n_ubatch = n_batch >= window.
        n_batch = max(cfg.batch_tokens, window)
        kwargs: dict[str, Any] = {}
        if cfg.n_threads is not None:
            kwargs["n_threads"] = kwargs["n_threads_batch"] = cfg.n_threads
        llm = llama_cpp.Llama(
            model_path=cfg.path,
            embedding=True,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
            n_ctx=n_batch,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_gpu_layers=cfg.n_gpu_layers,
            verbose=False,
            **kwargs,
        )
        try:
            prompt = GgufPromptTokenizer(llm, info, max_length=window, max_query_tokens=cfg.max_query_tokens)
            batch = LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=cfg.max_batch_size, verbose=False)
        except BaseException:
            llm.close()
            raise
        self._info, self._prompt, self._batch, self._n_batch, self._llm = info, prompt, batch, n_batch, llm

    def _decode(self, prompts: list[list[int]]) -> list[list[float]]:
        import llama_cpp

        llm, batch, info = self._llm, self._batch, self._info
        if llm is None or batch is None or info is None:
            raise EngineUnavailableError("model is not loaded")
        ctx = llm.ctx
        n_out = info.n_outputs
        batch.reset()
        for seq, ids in enumerate(prompts):
            batch.add_sequence(ids, seq, True)
        # A causal model (Qwen3) keeps a KV cache: start every batch from an empty one.
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        rc = llama_cpp.llama_decode(ctx, batch.batch)
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc}")
        out: list[list[float]] = []
        for seq in range(len(prompts)):
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, seq)
            if not ptr:
                raise EngineError("llama.cpp returned no rank output for a sequence")
            out.append([float(ptr[k]) for k in range(n_out)])
        batch.reset()
        return out


def _score(vec: list[float], info: GgufInfo, *, raw: bool) -> float:
    if info.family == "qwen3":
        return vec[0]  # already softmax([yes, no])[0] inside llama.cpp's graph
    if len(vec) == 1:
        logit = vec[0]
        return logit if raw else _sigmoid(logit)
    # Several labels: softmax, the last label is the "relevant" one (LABEL_1 of a 2-way head).
    if raw:
        return vec[-1]
    top = max(vec)
    exps = [math.exp(v - top) for v in vec]
    return exps[-1] / sum(exps)


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
