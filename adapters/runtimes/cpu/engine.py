"""Encoder families (cross-encoder, bi-encoder) on OpenVINO's CPU plugin, in-process.

Start (``start.OpenVinoStart``, in a worker thread): the checkpoint exported to OpenVINO IR (or
read from the export cache), compiled for the configured precision, and -- for bf16 / int8 --
admitted only if the parity gate finds the fp32 ranking kept.

Serving: one worker thread per stream (``batcher.RowBatcher``; OpenVINO releases the GIL), each
with its own infer request on its share of the cores. A free worker plans the rows of the
waiting requests into batches of near-equal length and runs the one holding the oldest
request's shortest row, so a lone request's batches spread over every stream and concurrent
requests' rows of one length share a batch (less padding); ``batching = "per-request"`` never
mixes requests in a batch.

Imported only through ``adapters.registry``: importing it pulls in OpenVINO and torch.
"""

from __future__ import annotations

import asyncio
import os
import queue
from typing import Any

import anyio.to_thread
import msgspec
import numpy as np

from adapters.base import (
    EngineError,
    EngineObserver,
    EngineUnavailableError,
    PromptTokenizer,
    ScoreJob,
    ScoreResult,
)
from adapters.families.base import Row
from adapters.families.encoder import EncoderFamily
from adapters.runtimes.cpu.batcher import RowBatcher, bucket_batches
from adapters.runtimes.cpu.refine import refine, refine_space
from adapters.runtimes.cpu.start import OpenVinoStart
from schemas.config import OpenVinoEngineConfig

__all__ = ("OpenVinoEngine", "bucket_batches")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class OpenVinoEngine(OpenVinoStart):
    """:class:`adapters.base.RerankEngine` for encoder families on OpenVINO (CPU)."""

    runtime = "openvino"

    def __init__(self, config: OpenVinoEngineConfig) -> None:
        self._config = config
        self._family: EncoderFamily | None = None
        self._compiled: Any = None
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.threads = config.threads or _cores()
        # None: OpenVINO's throughput hint picks the streams for these threads (set at compile).
        self.streams = config.streams or 1
        self._inputs: list[str] = []
        self._info: dict[str, str] = {}
        self.parity: dict[str, Any] | None = None  # the gate's measurement (reduced precisions)
        self.cache_hit: bool | None = None  # whether the fp32 export came from the cache
        # Refinement (refine_top > 0): the fp32 model's infer requests and the error bound.
        self._exact: queue.SimpleQueue[Any] | None = None
        self._exact_model: Any = None
        self._delta = 0.0
        # The bound per request kind (raw_scores or not): a softmax head orders its probabilities
        # for scores but its logits for raw scores, whose errors differ (refine_space).
        self._deltas: dict[bool, float] = {}
        self._refined = [0, 0]  # items re-scored in fp32, items scored
        self.observer: EngineObserver | None = None
        self._batcher: RowBatcher | None = None

    # -- protocol ---------------------------------------------------------------------------
    @property
    def tokenizer(self) -> PromptTokenizer | None:
        return self._family.tokenizer if self._compiled is not None and self._family is not None else None

    @property
    def supports_raw_scores(self) -> bool:
        return self._family is not None and self._family.supports_raw_scores

    def describe(self) -> dict[str, str]:
        out = {"runtime": self.runtime, "device": "cpu", "precision": self._config.precision, **self._info}
        if self.parity is not None:  # the gate's measurement, for /ready and the benchmarks
            out["parity_kept"] = f"{self.parity['kept']}/{self.parity['queries']}"
            out["speed_vs_fp32"] = f"{self.parity['speed_vs_fp32']:.2f}"  # measured at start (start.py)
            if "ndcg@10" in self.parity:  # the qrels gate's verdict (qrels_set)
                out["qrels_ndcg@10"] = f"{self.parity['ndcg@10']:.4f} (fp32 {self.parity['ndcg@10_reference']:.4f})"
        if self._exact is not None:
            out["refine_top"] = str(self._config.refine_top)
            out["refined_share"] = f"{self._refined[0] / max(self._refined[1], 1):.3f}"
        if self._family is not None:
            out["family"] = self._family.name
            out["family_reason"] = self._family.detection.reason
        return out

    def stats(self) -> dict[str, Any]:
        return self._batcher.stats() if self._batcher is not None else {"batches": 0, "rows": 0}

    def queue_depth(self) -> int:
        return self._batcher.waiting() if self._batcher is not None else 0

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._load)
        await anyio.to_thread.run_sync(self._warm_up)
        cfg = self._config
        # One worker per infer request; "shared" plans the oldest requests' rows together, until
        # they hold a few batches per stream, the oldest's own rows included ("per-request": that one alone).
        window = 0 if cfg.batching == "per-request" else 2 * self.streams * cfg.batch_tokens
        runners = [self._runner(self._requests.get_nowait()) for _ in range(self.streams)]
        self._batcher = RowBatcher(
            runners,
            batch_tokens=cfg.batch_tokens,
            max_batch_size=cfg.max_batch_size,
            window_tokens=window,
            on_batch=self._counted,
            name=f"openvino-{cfg.name}",
            error_type=EngineUnavailableError,
        )  # stopped: retry (503), as once stopped

    async def stop(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            await anyio.to_thread.run_sync(batcher.stop)
        self._compiled = self._exact_model = self._exact = None
        self._requests = queue.SimpleQueue()

    async def check_health(self) -> None:
        if self._compiled is None:
            raise EngineUnavailableError("model is not loaded")

    async def score(self, job: ScoreJob) -> ScoreResult:
        # Read once: a stop() meanwhile must neither skip refinement nor pull the fp32 model from under it.
        family, batcher, exact = self._family, self._batcher, self._exact
        if family is None or batcher is None or self._compiled is None:
            raise EngineUnavailableError("model is not loaded")
        rows = family.rows(job)
        pending = batcher.submit(rows, [len(r.ids) for r in rows])
        try:
            outputs = await pending.future
        except asyncio.CancelledError:
            # Timeout or client gone: the rows no batch has taken are dropped.
            batcher.cancel(pending)
            raise
        if exact is not None:
            # The fp32 re-scoring runs on the fp32 model's own infer requests, beside the batcher's.
            scores = await anyio.to_thread.run_sync(self._refine, job, outputs, exact)
        else:
            scores = family.scores(job, outputs)
        return ScoreResult(scores=scores, input_tokens=sum(len(r.ids) for r in rows))

    def _refine(self, job: ScoreJob, outputs: np.ndarray, pool: queue.SimpleQueue[Any]) -> list[float]:
        """``job``'s scores, the items the reduced precision cannot order re-scored in fp32 (refine.py)
        on the fp32 model's infer requests ``pool``."""
        family = self._family
        assert family is not None
        space, to_score = refine_space(family, job)
        values = family.scores(space, outputs)
        tie = self._config.parity_tie

        def exact(pick: list[int]) -> list[float]:
            sub = msgspec.structs.replace(space, item_ids=[job.item_ids[i] for i in pick], top_n=None)
            return family.scores(sub, self._infer_all(family.rows(sub), pool))

        values, refined = refine(
            values,
            delta=self._deltas[space.raw_scores],
            top=self._config.refine_top,
            exact=exact,
            rounds=self._config.refine_rounds,
            tied=lambda lo, hi: to_score(hi) - to_score(lo) < tie,
        )
        self._refined[0] += refined
        self._refined[1] += len(values)
        return [to_score(v) for v in values]

    def _infer_all(self, rows: list[Row], requests: queue.SimpleQueue[Any] | None = None) -> np.ndarray:
        """(len(rows), k) outputs from this thread: the batches run side by side on the free
        infer requests of ``requests`` (default: the serving model's), started asynchronously,
        so a few rows re-scored in fp32 still use every stream's cores."""
        cfg = self._config
        pool = self._requests if requests is None else requests
        batches = bucket_batches(
            [len(r.ids) for r in rows],
            batch_tokens=cfg.batch_tokens,
            max_batch_size=cfg.max_batch_size,
            parts=self.streams,
        )
        held = [pool.get()]  # waits only while another caller holds every request
        try:
            while len(held) < len(batches):
                try:
                    held.append(pool.get_nowait())
                except queue.Empty:
                    break
            results: list[np.ndarray] = []
            for start in range(0, len(batches), len(held)):
                wave = list(zip(held, batches[start : start + len(held)], strict=False))
                try:
                    for request, batch in wave:
                        request.start_async(self._arrays([rows[i] for i in batch]))
                    for request, _ in wave:
                        request.wait()
                        results.append(np.array(request.get_output_tensor(0).data, dtype=np.float32, copy=True))
                except Exception as exc:
                    raise _inference_failed(exc) from exc
        finally:
            for request in held:
                pool.put(request)
        out = np.empty((len(rows), results[0].shape[1] if results else 1), dtype=np.float32)
        for batch, res in zip(batches, results, strict=True):
            out[batch] = res
        return out

    def _runner(self, request: Any) -> Any:
        """A worker's batch function: its own infer request, right-padded arrays in, outputs out."""

        def run(rows: list[Row]) -> np.ndarray:
            try:
                result = request.infer(self._arrays(rows))
            except Exception as exc:
                raise _inference_failed(exc) from exc
            return np.array(result[0], dtype=np.float32, copy=True)  # the request's buffer is reused

        return run

    def _counted(self, rows: int, tokens: int) -> None:
        if self.observer is not None:  # Prometheus metrics: safe from the worker threads
            self.observer.step(rows=rows, tokens=tokens)

    def _arrays(self, rows: list[Row]) -> dict[str, np.ndarray]:
        """Right-padded model inputs (the pad id; positions of RoBERTa-style models skip pads)."""
        assert self._family is not None
        width = max(len(r.ids) for r in rows)
        ids = np.full((len(rows), width), self._family._pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        types = np.zeros((len(rows), width), dtype=np.int64) if "token_type_ids" in self._inputs else None
        for i, r in enumerate(rows):
            ids[i, : len(r.ids)] = r.ids
            mask[i, : len(r.ids)] = 1
            if types is not None and r.segment_start is not None:
                types[i, r.segment_start : len(r.ids)] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if types is not None:
            out["token_type_ids"] = types
        return out

    def _infer(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        # The parity gate's scoring at start, one batch at a time, before the workers own the requests.
        request = self._requests.get_nowait()
        try:
            result = request.infer(arrays)
            return np.array(result[0], dtype=np.float32, copy=True)  # the request's buffer is reused
        finally:
            self._requests.put(request)


def _inference_failed(exc: Exception) -> EngineError:
    """The engine's failure (502) for the batch's requests, not an unexpected 500: the plugin's
    text (an op, a shape) goes to the log with the cause, never to the client."""
    return EngineError(f"OpenVINO inference failed: {type(exc).__name__}: {exc}")
