"""Any family's model on Hugging Face transformers (CPU fp32 or CUDA bf16), in-process.

bf16 / fp16 on a CPU is the user's reduced precision: kept only if the parity gate finds fp32's
ranking on a golden set at start (``adapters.runtimes.parity``, the rule OpenVINO's bf16 / int8
are admitted by).

Rows (the family's prompts or sequences) are sorted by length and packed into batches bounded
by a padded-token budget; each forward pass runs in a worker thread behind a capacity limiter
so the event loop keeps serving. What a row is and how its output becomes a score is the
family's business (``adapters.families``).

Imported only through ``adapters.registry``: importing it pulls in torch and transformers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import structlog
import torch

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
from adapters.families.base import WEIGHTS_LOCK, Family, Row
from adapters.families.checkpoint import check_window
from adapters.families.qwen3 import max_position_embeddings
from adapters.runtimes.parity import (
    GoldenQuery,
    compare_rankings,
    fixed_threads,
    golden_set_or_refuse,
    graded_golden_set,
)
from adapters.runtimes.qrels_gate import QrelsSet, judge, read_qrels_set
from schemas.config import TransformersEngineConfig

__all__ = ("TransformersEngine", "TransformersQwen3Engine", "plan_batches")

log = structlog.get_logger("adapters.runtimes.transformers")


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


class TransformersEngine:
    """:class:`adapters.base.RerankEngine` running any family's model on transformers.

    The family (resolved at start, ``family = "auto"`` detects it) supplies the tokenizer, the
    model head and the score rule; this class owns the device, dtype, batching and threads.
    """

    runtime = "transformers"

    def __init__(self, config: TransformersEngineConfig) -> None:
        self._config = config
        self._family: Family | None = None
        self._loaded = False
        self._device: torch.device | None = None
        self._dtype: torch.dtype | None = None
        self._limiter = anyio.CapacityLimiter(config.max_parallel_batches)
        self._batches = self._rows = 0  # forward passes run and rows scored (GET /ready)
        self.observer: EngineObserver | None = None
        # Jobs that called score() and have not started their first forward pass yet; the
        # worker thread that starts a job's first pass takes it off, under this lock.
        self.queued_jobs = 0
        self._queue_lock = threading.Lock()
        # Recent engine time of one job (its forward passes, its waits for a slot excluded), a moving
        # average: with queued_jobs, the expected wait a fallback chain's spill-over reads.
        self._job_s: float | None = None
        self.parity: dict[str, Any] | None = None  # the gate's figures, for a reduced dtype on a CPU

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"batches": self._batches, "rows": self._rows}
        if self.parity is not None:
            out["parity"] = self.parity
        return out

    @property
    def tokenizer(self) -> PromptTokenizer | None:
        family = self._family
        if not self._loaded or family is None or family.takes_texts:
            return None  # text families (jina-v3) get texts: the model tokenizes itself
        return family.tokenizer

    @property
    def supports_raw_scores(self) -> bool:
        return self._family is not None and self._family.supports_raw_scores

    @property
    def device(self) -> str:
        return str(self._device) if self._device is not None else "unloaded"

    def describe(self) -> dict[str, str]:
        """Family, runtime, device and dtype for /ready and /v1/models."""
        out = {"runtime": self.runtime, "device": self.device}
        if self._dtype is not None:
            out["dtype"] = str(self._dtype).removeprefix("torch.")
        if self._family is not None:
            out["family"] = self._family.name
            out["family_reason"] = self._family.detection.reason
        return out

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._load)

    async def stop(self) -> None:
        family, self._family, self._loaded = self._family, None, False
        if family is not None:
            family.unload()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def check_health(self) -> None:
        if not self._loaded:
            raise EngineUnavailableError("model is not loaded")

    async def score(self, job: ScoreJob) -> ScoreResult:
        family = self._family
        if family is None or not self._loaded:
            raise EngineUnavailableError("model is not loaded")
        if family.takes_texts:
            return await self._score_texts(family, job)
        rows = family.rows(job)
        outputs: list[Any] = [None] * len(rows)
        batches = plan_batches(
            [len(r.ids) for r in rows],
            batch_tokens=self._config.batch_tokens,
            max_batch_size=self._config.max_batch_size,
        )
        # Time between handing a batch to the limiter and its thread starting is queueing
        # (another request's forward pass holds the slot), not engine work.
        queue_s = 0.0
        began = time.perf_counter()
        waiting = [True]  # shared with the worker threads: cleared when the first pass starts
        with self._queue_lock:
            self.queued_jobs += 1
        try:
            # A cancelled request (client gone, timeout) stops here: the running forward pass
            # finishes in its thread, the batches not yet started never run.
            for batch in batches:
                batch_rows = [rows[i] for i in batch]
                submitted = time.perf_counter()
                started, out = await anyio.to_thread.run_sync(
                    self._timed_forward, family, batch_rows, waiting, limiter=self._limiter
                )
                queue_s += max(0.0, started - submitted)
                self._batches += 1
                self._rows += len(batch)
                if self.observer is not None:
                    # Padded tokens: what the forward pass really computed.
                    self.observer.step(rows=len(batch), tokens=len(batch) * max(len(r.ids) for r in batch_rows))
                for i, vec in zip(batch, out, strict=True):
                    outputs[i] = vec
        finally:
            self._leave_queue(waiting)  # cancelled (or empty) before any pass started
        if batches:
            job_s = time.perf_counter() - began - queue_s
            self._job_s = job_s if self._job_s is None else 0.8 * self._job_s + 0.2 * job_s
        scores = family.scores(job, torch.stack(outputs) if outputs else torch.empty(0, 1))
        return ScoreResult(scores=scores, input_tokens=sum(len(r.ids) for r in rows), queue_s=queue_s)

    def queue_depth(self) -> int:
        """Requests waiting for their first forward pass (``rerank_queued_requests``)."""
        return self.queued_jobs

    def expected_wait_s(self) -> float:
        """Seconds a job submitted now would wait for its first pass: the jobs queued ahead of it times the
        recent engine time of a job, over the passes that run at once (``max_parallel_batches``); 0
        before any job ran. Read by a chain's spill-over (``gateway.serving.routing.saturation``)."""
        if self._job_s is None:
            return 0.0
        return self.queued_jobs * self._job_s / self._config.max_parallel_batches

    async def _score_texts(self, family: Any, job: ScoreJob) -> ScoreResult:
        """Listwise families: one model call per block of documents, scores back in input order."""
        size = family.block_size
        scores: list[float] = []
        for start in range(0, len(job.texts), size):
            block = job.texts[start : start + size]
            scores += await anyio.to_thread.run_sync(self._block, family, job, block, limiter=self._limiter)
        blocks = -(-len(job.texts) // size)
        return ScoreResult(scores=scores, input_tokens=family.count_tokens(job.query, job.texts, blocks))

    # -- worker-thread code ----------------------------------------------------------------
    def _load(self) -> None:
        cfg = self._config
        family = create_family(cfg, self.runtime)
        self._family = family
        device = _resolve_device(cfg.device)
        dtype = _resolve_dtype(cfg.dtype, device)
        if not family.takes_texts:  # listwise families (jina-v3) tokenize inside the model
            family.load_tokenizer()
            # A window over the checkpoint's positions would score positions the model never saw;
            # encoder families cap theirs at the checkpoint's, so this bites Qwen3 configs.
            check_window(
                cfg.name,
                family.window(),
                max_position_embeddings(cfg.path, cfg.revision, trust_remote_code=cfg.trust_remote_code),
            )
        reduced = device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)
        # The operator's judgements, when given, decide instead of the order rule (read before the weights).
        qrels = read_qrels_set(cfg.name, cfg.qrels_set, cfg.qrels_split) if reduced and cfg.qrels_set else None
        golden = (
            golden_set_or_refuse(
                cfg.name,
                cfg.parity_set,
                lambda: graded_golden_set(queries=cfg.parity_queries, documents=cfg.parity_documents),
            )
            if reduced and qrels is None
            else []
        )
        with WEIGHTS_LOCK:
            family.load_torch(device, torch.float32 if reduced else dtype)
        if reduced:
            self.parity = (
                _parity_gate(family, cfg, device, dtype, golden)
                if qrels is None
                else _qrels_gate(family, cfg, device, dtype, qrels)
            )
        self._device, self._dtype, self._loaded = device, dtype, True

    def _leave_queue(self, waiting: list[bool]) -> None:
        with self._queue_lock:
            if waiting[0]:
                waiting[0] = False
                self.queued_jobs -= 1

    def _timed_forward(self, family: Family, rows: list[Row], waiting: list[bool]) -> tuple[float, list[torch.Tensor]]:
        started = time.perf_counter()
        self._leave_queue(waiting)
        try:
            return started, self._forward(family, rows)
        except Exception as exc:
            raise _forward_failed(exc) from exc

    @staticmethod
    def _block(family: Any, job: ScoreJob, block: list[str]) -> list[float]:
        try:
            return family.score_block(job.query, block, raw=job.raw_scores)
        except Exception as exc:
            raise _forward_failed(exc) from exc

    @staticmethod
    @torch.inference_mode()
    def _forward(family: Family, rows: list[Row]) -> list[torch.Tensor]:
        return list(family.forward(rows).float().cpu())


def _parity_gate(
    family: Family, cfg: TransformersEngineConfig, device: torch.device, dtype: torch.dtype, golden: list[GoldenQuery]
) -> dict[str, Any]:
    """Score ``golden`` with the fp32 weights ``family`` holds, reload them in ``dtype``, score
    again; refuse (or warn) unless the reduced precision keeps fp32's top-10 order. Both passes
    take the path requests take (the family's prompts, batches and score rule), on the gate's fixed
    thread count (``parity.fixed_threads``): the same verdict on every start."""
    with fixed_threads() as threads:
        reference = _golden_scores(family, cfg, golden)
    family.unload()
    with WEIGHTS_LOCK:
        family.load_torch(device, dtype)
    with fixed_threads():
        reduced = _golden_scores(family, cfg, golden)
    report = compare_rankings(reference, reduced, tie=cfg.parity_tie)
    name = str(dtype).removeprefix("torch.")
    parity = {
        "precision": name,
        "golden": cfg.parity_set or "generated",
        "queries": report.queries,
        "kept": report.kept,
        "agreement": round(report.agreement, 4),
        "mean_shared": round(report.mean_shared, 2),
        "max_score_change": report.max_delta,
        "tie": cfg.parity_tie,
        "min_agreement": cfg.parity_min_agreement,
        "threads": threads,
    }
    if report.agreement >= cfg.parity_min_agreement:
        return parity
    line = f"model {cfg.name!r}: {report.line(name)}, below parity_min_agreement {cfg.parity_min_agreement:.0%}"
    if cfg.precision_gate == "refuse":
        family.unload()
        raise EngineConfigError(
            f'{line}; refused: use dtype = "float32" on a CPU, or precision_gate = "warn" '
            "after checking the ranking on your own data"
        )
    log.warning("parity_gate_failed", model=cfg.name, detail=line, precision_gate="warn")
    return parity


@torch.inference_mode()
def _golden_scores(family: Family, cfg: TransformersEngineConfig, golden: list[GoldenQuery]) -> list[list[float]]:
    """Each golden query's scores as a request without options gets them (the model's configured
    instruction, else the tokenizer's default; a document cut to the window, as ``truncate`` would)."""
    out: list[list[float]] = []
    for g in golden:
        if family.takes_texts:  # listwise (jina-v3): blocks of documents, as _score_texts sends them
            size = family.block_size  # type: ignore[attr-defined]
            out.append(
                [
                    s
                    for i in range(0, len(g.documents), size)
                    for s in family.score_block(g.query, g.documents[i : i + size], raw=False)
                ]
            )  # type: ignore[attr-defined]
            continue
        tok = family.tokenizer
        instruction = cfg.instruction if cfg.instruction is not None else getattr(tok, "default_instruction", "")
        shared = tok.encode_shared(g.query, instruction)
        room = tok.item_room(shared)
        job = ScoreJob(
            query=g.query,
            instruction=instruction,
            shared_ids=shared,
            item_ids=[ids[:room] for ids in tok.encode_documents(g.documents)],
        )
        rows = family.rows(job)
        outputs: list[Any] = [None] * len(rows)
        for batch in plan_batches(
            [len(r.ids) for r in rows], batch_tokens=cfg.batch_tokens, max_batch_size=cfg.max_batch_size
        ):
            for i, vec in zip(batch, TransformersEngine._forward(family, [rows[i] for i in batch]), strict=True):
                outputs[i] = vec
        out.append(family.scores(job, torch.stack(outputs)))
    return out


def _qrels_gate(
    family: Family, cfg: TransformersEngineConfig, device: torch.device, dtype: torch.dtype, qrels: QrelsSet
) -> dict[str, Any]:
    """The gate on the operator's judgements (``qrels_set``, adapters/runtimes/qrels_gate.py): fp32
    and ``dtype`` score its queries through the request path, as ``_parity_gate``'s passes do;
    refused (or warned) unless ``dtype``'s nDCG@10 is within ``qrels_tolerance`` of fp32's."""
    reference = _golden_scores(family, cfg, qrels.queries)
    family.unload()
    with WEIGHTS_LOCK:
        family.load_torch(device, dtype)
    verdict = judge(qrels, reference, _golden_scores(family, cfg, qrels.queries), tolerance=cfg.qrels_tolerance)
    name = str(dtype).removeprefix("torch.")
    figures = {"precision": name, **verdict.figures()}
    log.info("qrels_gate", model=cfg.name, **figures)
    if verdict.admitted:
        return figures
    line = f"model {cfg.name!r}: {verdict.line(name)}"
    if cfg.precision_gate == "refuse":
        family.unload()
        raise EngineConfigError(
            f'{line}; refused: use dtype = "float32" on a CPU, a larger qrels_tolerance, or precision_gate = "warn"'
        )
    log.warning("qrels_gate_failed", model=cfg.name, detail=line, precision_gate="warn")
    return figures


def _forward_failed(exc: Exception) -> EngineError:
    """The engine's failure (502), not an unexpected 500: torch's text (a shape, CUDA out of
    memory) goes to the log with the cause, never to the client."""
    return EngineError(f"forward pass failed: {type(exc).__name__}: {exc}")


# Kept for code written before families existed.
TransformersQwen3Engine = TransformersEngine


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
