"""Encoder families (cross-encoder, bi-encoder) on OpenVINO's CPU plugin, in-process.

Start: the family loads its tokenizer (the gateway keeps tokenizing, truncating, chunking and
deduplicating), the checkpoint is exported to OpenVINO IR or read from the export cache
(``export``), compiled for the configured precision, and -- for bf16 / int8 -- admitted only if
the parity gate (``parity``) finds the fp32 ranking kept.

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
import threading
from pathlib import Path
from typing import Any

import anyio.to_thread
import msgspec
import numpy as np
import openvino as ov
import structlog

from adapters.base import (
    EngineConfigError,
    EngineError,
    EngineObserver,
    EngineUnavailableError,
    PromptTokenizer,
    ScoreJob,
    ScoreResult,
)
from adapters.families import create_family
from adapters.families.base import Row
from adapters.families.encoder import EncoderFamily
from adapters.runtimes.cpu.batcher import RowBatcher, bucket_batches
from adapters.runtimes.cpu.export import (
    ModelCache,
    cache_key,
    checkpoint_digest,
    checkpoint_dir,
    default_cache_dir,
    export_family,
)
from adapters.runtimes.cpu.parity import GoldenQuery, compare_rankings, generate_golden_set, read_golden_set
from adapters.runtimes.cpu.refine import refine, refine_space
from schemas.config import OpenVinoEngineConfig

__all__ = ("OpenVinoEngine", "bucket_batches")

log = structlog.get_logger("adapters.runtimes.cpu")

# One export at a time in this process: torch's tracer keeps global state (two models traced at
# once fail its sanity check), and a second model of the same checkpoint then finds the cache entry.
_EXPORT_LOCK = threading.Lock()

# The int8 recipe (see _compress_int8). Measured on all-MiniLM-L6-v2 with a head (docs/cpu-runtimes.md):
# per-channel int8 weights with activations quantized per 32 values at run time changed logits
# about half as much as NNCF's static quantization (SmoothQuant, calibrated per-tensor
# activations; attention and head kept in fp32) and ran faster; neither kept the strict top-10.
_INT8_RECIPE = "weights-int8-sym-per-channel+dynamic-activations-32"
_INT8_GROUP = 32


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class OpenVinoEngine:
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
        self._batcher = RowBatcher(runners, batch_tokens=cfg.batch_tokens, max_batch_size=cfg.max_batch_size,
                                   window_tokens=window, on_batch=self._counted, name=f"openvino-{cfg.name}",
                                   error_type=EngineUnavailableError)  # stopped: retry (503), as once stopped

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

        values, refined = refine(values, delta=self._deltas[space.raw_scores], top=self._config.refine_top, exact=exact,
                                 rounds=self._config.refine_rounds, tied=lambda lo, hi: to_score(hi) - to_score(lo) < tie)
        self._refined[0] += refined
        self._refined[1] += len(values)
        return [to_score(v) for v in values]

    def _infer_all(self, rows: list[Row], requests: queue.SimpleQueue[Any] | None = None) -> np.ndarray:
        """(len(rows), k) outputs from this thread: the batches run side by side on the free
        infer requests of ``requests`` (default: the serving model's), started asynchronously,
        so a few rows re-scored in fp32 still use every stream's cores."""
        cfg = self._config
        pool = self._requests if requests is None else requests
        batches = bucket_batches([len(r.ids) for r in rows], batch_tokens=cfg.batch_tokens,
                                 max_batch_size=cfg.max_batch_size, parts=self.streams)
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

    # -- start (worker thread) ----------------------------------------------------------------
    def _load(self) -> None:
        cfg = self._config
        family = create_family(cfg, self.runtime)
        if not isinstance(family, EncoderFamily):
            raise EngineConfigError(f"model {cfg.name!r}: the openvino runtime runs encoder families only")
        family.load_tokenizer()
        self._family = family
        self._inputs = ["input_ids", "attention_mask", *(["token_type_ids"] if family.typed else [])]
        core = ov.Core()
        cache = ModelCache(Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir())
        digest = checkpoint_digest(checkpoint_dir(cfg.path, cfg.revision))
        options = {
            "family": family.name,
            "inputs": self._inputs,
            "pooling": getattr(family, "pooling", None),
            "num_labels": family.files.num_labels,
        }
        info = {"model": cfg.name, "path": cfg.path, "options": options}
        with _EXPORT_LOCK:
            fp32, self.cache_hit = cache.get_or_build(
                cache_key(digest, {**options, "precision": "fp32"}), core, lambda: export_family(family), info
            )
        log.info("openvino_export", model=cfg.name, cache="hit" if self.cache_hit else "exported", dir=str(cache.root))
        if cfg.precision == "fp32":
            self._use(core, fp32, "f32")
            return
        # Reduced precision: measure it against fp32 on the golden set before serving anything.
        golden = read_golden_set(cfg.parity_set) if cfg.parity_set else generate_golden_set(
            family.tokenizer.vocab, queries=cfg.parity_queries, documents=cfg.parity_documents
        )
        self._use(core, fp32, "f32")
        reference = self._score_golden(golden)
        if cfg.refine_top:
            # Calibration queries of their own (another seed): the bound is then checked by the
            # gate on golden queries it was not measured on.
            calibration = generate_golden_set(family.tokenizer.vocab, queries=max(4, cfg.parity_queries // 4),
                                              documents=cfg.parity_documents, seed=21)
            calibration_fp32 = self._space_values(calibration)
            exact = (self._compiled, self._requests)  # the requests keep their compiled model's reference
        if cfg.precision == "bf16":
            self._use(core, fp32, "bf16")
        else:
            key = cache_key(digest, {**options, "precision": "int8", "recipe": _INT8_RECIPE})
            with _EXPORT_LOCK:
                int8, _ = cache.get_or_build(key, core, lambda: _compress_int8(fp32), info)
            self._use(core, int8, "f32", dynamic_group=_INT8_GROUP)
        if cfg.refine_top:
            calibration_reduced = self._space_values(calibration)
            self._deltas = {
                raw: cfg.refine_margin * max(abs(a - b) for ref, red in zip(calibration_fp32[raw], calibration_reduced[raw],
                                                                            strict=True) for a, b in zip(ref, red, strict=True))
                for raw in (False, True)
            }
            self._delta = self._deltas[cfg.raw_scores]
            self._exact_model, self._exact = exact
        reduced = self._score_golden(golden)
        report = compare_rankings(reference, reduced, tie=cfg.parity_tie)
        self.parity = {"queries": report.queries, "kept": report.kept, "agreement": report.agreement,
                       "mean_shared": report.mean_shared, "max_delta": report.max_delta}
        mode = cfg.precision
        if self._exact is not None:
            self.parity["refined_share"] = self._refined[0] / max(self._refined[1], 1)
            self.parity["refine_delta"] = self._delta
            mode = f"{cfg.precision}, fp32 refining its top-{cfg.refine_top}"
        log.info("parity_gate", model=cfg.name, precision=cfg.precision, **self.parity)
        if report.agreement < cfg.parity_min_agreement:
            self._compiled = self._exact_model = self._exact = None
            raise EngineConfigError(
                f"model {cfg.name!r}: {report.line(mode)}, below parity_min_agreement "
                f"{cfg.parity_min_agreement:.0%}; refused, use precision = \"fp32\""
            )

    def _use(self, core: ov.Core, model: Any, precision: str, *, dynamic_group: int = 0) -> None:
        """Compile ``model`` with ``streams`` infer requests sharing ``threads`` cores."""
        streams: dict[str, Any] = (
            {"NUM_STREAMS": self._config.streams} if self._config.streams else {"PERFORMANCE_HINT": "THROUGHPUT"}
        )
        compiled = core.compile_model(model, "CPU", {
            **streams,
            "INFERENCE_PRECISION_HINT": precision,
            "INFERENCE_NUM_THREADS": self.threads,
            # 0 (fp32, bf16): activations stay in the inference precision, so the exact mode
            # computes what fp32 torch does. int8: activations quantized per group at run time.
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": dynamic_group,
        })
        self.streams = int(compiled.get_property("NUM_STREAMS"))
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(self.streams):
            requests.put(compiled.create_infer_request())
        self._compiled, self._requests = compiled, requests
        self._info = {
            # What the plugin really runs: "bf16" on a CPU without bf16 instructions reads "f32".
            "inference_precision": _type_name(compiled.get_property("INFERENCE_PRECISION_HINT")),
            "threads": str(self.threads),
            "streams": str(self.streams),
        }

    def _warm_up(self) -> None:
        """One small inference on every infer request, one after another, before the workers own them.

        Why: pyopenvino converts a result to numpy through pybind11's numpy API, whose first use
        initialises a function-local static that imports numpy under the GIL. Two workers making
        that first conversion at once can deadlock when the GIL switches during the import: one
        holds the static's guard and waits for the GIL, the other holds the GIL and waits for the
        guard (seen: an fp32 model's first concurrent requests hung, on a loaded machine, in two
        starts of four, one worker waiting for the GIL inside ``infer``, the other on a one-time
        initialisation lock; reduced precisions were spared because the parity gate infers at
        start, one batch at a time). Done here, every such first use is behind us; it also takes
        the plugin's first-inference setup off the first request's latency."""
        assert self._family is not None
        tok = self._family.tokenizer
        shared = tok.encode_shared("warm-up", "")
        job = ScoreJob(query="warm-up", instruction="", shared_ids=shared, item_ids=tok.encode_documents(["warm-up"]))
        arrays = self._arrays(self._family.rows(job))
        for _ in range(self.streams):  # _infer takes the oldest idle request and puts it back last
            self._infer(arrays)

    def _golden_rows(self, golden: list[GoldenQuery]) -> list[tuple[ScoreJob, list[Row]]]:
        assert self._family is not None
        tok = self._family.tokenizer
        out = []
        for g in golden:
            shared = tok.encode_shared(g.query, "")
            room = tok.item_room(shared)
            items = [ids[:room] for ids in tok.encode_documents(g.documents)]
            job = ScoreJob(query=g.query, instruction="", shared_ids=shared, item_ids=items, raw_scores=self._config.raw_scores)
            out.append((job, self._family.rows(job)))
        return out

    def _space_values(self, golden: list[GoldenQuery]) -> dict[bool, list[list[float]]]:
        """The values refinement orders (refine_space), unrefined, for each golden query: for
        requests with and without raw_scores (the same, but for a softmax head's)."""
        assert self._family is not None
        out: dict[bool, list[list[float]]] = {False: [], True: []}
        for job, rows in self._golden_rows(golden):
            outputs = self._infer_all(rows)
            for raw, values in out.items():
                space = refine_space(self._family, msgspec.structs.replace(job, raw_scores=raw))[0]
                values.append(self._family.scores(space, outputs))
        return out

    def _score_golden(self, golden: list[GoldenQuery]) -> list[list[float]]:
        """Each golden query's scores, as a request gets them (refined when refining)."""
        assert self._family is not None
        scores = []
        for job, rows in self._golden_rows(golden):
            outputs = self._infer_all(rows)
            if self._exact is not None:
                scores.append(self._refine(job, outputs, self._exact))
            else:
                scores.append(self._family.scores(job, outputs))
        return scores


def _inference_failed(exc: Exception) -> EngineError:
    """The engine's failure (502) for the batch's requests, not an unexpected 500: the plugin's
    text (an op, a shape) goes to the log with the cause, never to the client."""
    return EngineError(f"OpenVINO inference failed: {type(exc).__name__}: {exc}")


def _type_name(value: Any) -> str:
    to_string = getattr(value, "to_string", None)
    return str(to_string()) if callable(to_string) else str(value)


def _compress_int8(model: Any) -> Any:
    """int8 weights, symmetric per output channel (NNCF); the CPU plugin then quantizes each
    matmul's activations per group of ``_INT8_GROUP`` values as it runs, and computes in int8."""
    import nncf

    return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM, ratio=1.0)
