"""The ``packed`` engine for cross-encoders: (query, document) pairs packed without padding.

Same pairs, truncation, chunking and score rule as every other cross-encoder runtime: the
family (``adapters.families.cross_encoder``) tokenizes (``[CLS] q [SEP] d [SEP]`` or
``<s> q </s></s> d </s>``) and turns the head's logits into scores (sigmoid / softmax, or raw).
What differs is how the work runs: ``encoder_forward.PackedEncoderReplica`` (BERT-style layers)
or ``modernbert_forward.PackedModernBertReplica`` (ModernBERT: RoPE, alternating global / local
attention), varlen, bidirectional, no padding, on each device of ``devices``, fed by the same
``scheduler.PackedScheduler`` as Qwen3 (steps filled from every waiting request up to
``batch_tokens``, host preparation of step k+1 overlapping step k on CUDA); on CUDA each step
is one replayed CUDA graph (``graphs``, ``cuda_graphs = "auto"``).
"""

from __future__ import annotations

import asyncio
import copy
import math
from typing import Any

import msgspec
import structlog
import torch

from adapters.base import EngineConfigError, EngineError, EngineUnavailableError, ScoreJob, ScoreResult
from adapters.families import create_family
from adapters.families.base import WEIGHTS_LOCK
from adapters.families.cross_encoder import CrossEncoderFamily, PairTokenizer
from adapters.runtimes.packed import gate
from adapters.runtimes.packed.buckets import token_bucket
from adapters.runtimes.packed.encoder_forward import PackedEncoderReplica
from adapters.runtimes.packed.encoder_replicas import make_replica
from adapters.runtimes.packed.engine import PackedEngineBase, resolve_devices
from adapters.runtimes.packed.pair_replica import PackedPairReplica, load_cross_encoder
from adapters.runtimes.packed.scheduler import PackedScheduler
from adapters.runtimes.parity import GoldenQuery, fixed_threads, golden_set_or_refuse
from schemas.config import PackedEngineConfig, packed_encoder_refusal

__all__ = ("PackedEncoderEngine",)

log = structlog.get_logger("adapters.runtimes.packed")


class PackedEncoderEngine(PackedEngineBase):
    """:class:`adapters.base.RerankEngine` for a cross-encoder, one model replica per configured device."""

    runtime = "packed"
    supports_raw_scores = True

    def __init__(self, config: PackedEngineConfig) -> None:
        self._config = config
        self._family: CrossEncoderFamily | None = None
        self._scheduler: PackedScheduler | None = None
        self._replicas: list[PackedPairReplica] = []
        self._dtype: torch.dtype | None = None
        # Read by the rerank service (``overlap_tokenizing``): a large request is submitted in
        # parts, the device starting on each while the next is tokenized.
        self.overlaps_tokenizing = False
        self.nonfinite_retries = 0  # requests whose non-finite logits were scored again (``score``)
        self._gate: gate.GateResult | None = None  # precision = "fp8": the ranking gate's verdict

    @property
    def tokenizer(self) -> PairTokenizer | None:
        return self._family.tokenizer if self._scheduler is not None and self._family is not None else None

    def describe(self) -> dict[str, str]:
        """Family, runtime, device and dtype for /ready and /v1/models."""
        out = {"runtime": self.runtime, "device": ",".join(str(r.device) for r in self._replicas) or "unloaded"}
        if self._dtype is not None:
            out["dtype"] = str(self._dtype).removeprefix("torch.")
        if self._family is not None:
            out["family"] = self._family.name
            out["family_reason"] = self._family.detection.reason
        return out

    def stats(self) -> dict[str, Any]:
        """Shown by ``/ready`` per model: the attention kernel, compilation, and the scheduler's counters."""
        graphs = [r.graphs.stats() for r in self._replicas if r.graphs is not None]
        errors = [r.graph_error for r in self._replicas if r.graph_error]
        base: dict[str, Any] = {
            "cuda_graphs": graphs[0] if len(graphs) == 1 else graphs or None,
            # the MLP activation in the up-projection's GEMM epilogue ("gelu" / "relu"), or None
            "gelu_epilogue": getattr(self._replicas[0], "epilogue", None) if self._replicas else None,
            # large idle requests submitted in parts (the rerank service reads it)
            "overlap_tokenizing": self.overlaps_tokenizing,
            "nonfinite_retries": self.nonfinite_retries,
        }
        if errors:
            base["cuda_graph_error"] = errors[0]
        fp8 = getattr(self._replicas[0], "fp8", None) if self._replicas else None
        if fp8 is not None:  # the same keys as the Qwen3 engine's
            base["precision"] = {
                "mode": getattr(self._replicas[0], "precision", None),
                **fp8.describe(),
                "gate": msgspec.structs.asdict(self._gate) if self._gate else None,
            }
        return self._stats(base)

    async def score(self, job: ScoreJob) -> ScoreResult:
        family, scheduler = self._family, self._scheduler
        if family is None or scheduler is None:
            raise EngineUnavailableError("model is not loaded")
        if not job.item_ids:
            return ScoreResult(scores=[], input_tokens=0)
        pair = family.tokenizer
        # BERT pairs: token type 1 from the document on (the family's Row.segment_start rule).
        segment = len(job.shared_ids) if pair.typed else None
        req = scheduler.submit(job.shared_ids, job.item_ids, pair.layout.tail, segment)
        logits = await _scores_of(scheduler, req)
        bad = [i for i, row in enumerate(logits) if not all(map(math.isfinite, row))]
        if bad:
            # Under 16 clients on the H200 about one request in a few thousand got non-finite
            # logits from a graph step (reports gpu-h200-2026-12-02-b to -d), the last pairs of the
            # step: the padding rows' NaN that FlashAttention-3 multiplies by zero weights, which
            # ``pair_replica.real_rows`` now zeroes (report gpu-h200-2026-12-03). Should a step
            # still give some, those items run once more in a step launched eagerly (no graph,
            # no padding); non-finite again, the request fails with the engine's 502. Counted in
            # /ready (with the replay's bucket and rows: ``cuda_graphs.recent_nonfinite``) and
            # logged either way, before the retry: a request cancelled meanwhile still leaves a trace.
            self.nonfinite_retries += 1
            log.warning("packed_nonfinite_logits", items=len(bad), of=len(logits))
            again = scheduler.submit(
                job.shared_ids, [job.item_ids[i] for i in bad], pair.layout.tail, segment, eager=True
            )
            redone = await _scores_of(scheduler, again)
            for i, row in zip(bad, redone, strict=True):
                logits[i] = row
            still = sum(1 for row in redone if not all(map(math.isfinite, row)))
            if still:
                log.warning("packed_nonfinite_logits_again", items=still)
        tokens = sum(req.prompt_len(i) for i in range(len(job.item_ids)))
        queue_s = (req.started_at - req.queued_at) if req.started_at is not None else 0.0
        return ScoreResult(scores=family.scores(job, logits), input_tokens=tokens, queue_s=queue_s)

    # -- worker-thread code ----------------------------------------------------------------
    def _load(self) -> None:
        cfg = self._config
        fp8 = cfg.precision == "fp8"
        if fp8 and cfg.dtype not in ("auto", "bfloat16"):  # the unquantized parts and the gate's reference
            raise EngineConfigError(
                f"model '{cfg.name}': precision = 'fp8' runs the rest of the model in bfloat16; "
                f"drop dtype = '{cfg.dtype}' or precision"
            )
        if cfg.split != "none":
            raise EngineConfigError(
                f"model '{cfg.name}': split = '{cfg.split}' is for Qwen3 rerankers; a cross-encoder "
                "fits one device: list several devices for one replica each"
            )
        family = create_family(cfg, "packed")
        if not isinstance(family, CrossEncoderFamily):
            raise EngineConfigError(
                f"model '{cfg.name}': the packed encoder path runs cross-encoders, not {family.name}"
            )
        why = packed_encoder_refusal(family.files.config, cfg.precision)
        if why is not None:
            raise EngineConfigError(f"model '{cfg.name}': {why}")
        golden = golden_set_or_refuse(cfg.name, cfg.parity_set, gate.golden_set) if fp8 else []
        family.load_tokenizer()
        devices = resolve_devices(cfg.devices)
        on_gpu = devices[0].type == "cuda"
        if fp8:
            dtype = torch.bfloat16
        elif cfg.dtype != "auto":
            dtype = getattr(torch, cfg.dtype)
        elif on_gpu:
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            dtype = torch.float32
        with WEIGHTS_LOCK:  # transformers' init contexts are process-wide (see engine.py)
            model = load_cross_encoder(cfg.path, cfg.revision, dtype)
        compile_ = cfg.compile == "on" or (cfg.compile == "auto" and on_gpu)
        try:
            replicas = [
                make_replica(
                    model if i == len(devices) - 1 else copy.deepcopy(model),
                    dev,
                    attention=cfg.attention,
                    compile=compile_,
                    gelu_epilogue=cfg.gelu_epilogue,
                )
                for i, dev in enumerate(devices)
            ]
        except ValueError as exc:  # gelu_epilogue = "on" for an activation without an epilogue
            raise EngineConfigError(f"model '{cfg.name}': {exc}") from None
        checks = [_warm_up(r, family) for r in replicas]  # compile and warm every replica before traffic
        if fp8:  # before any graph is captured: the gate's bf16 pass runs eagerly, and so does its FP8 one
            try:
                self._gate = _to_fp8(replicas, family, cfg, golden)
            except (ValueError, RuntimeError) as exc:  # no FP8 GEMM or region kernel works on this device
                if "precision = 'fp8'" not in str(exc):
                    raise
                raise EngineConfigError(f"model '{cfg.name}': {exc}") from None
        for r, check in zip(replicas, checks, strict=True):
            if r.device.type == "cuda":
                if cfg.cuda_graphs == "auto":
                    r.use_graphs(token_bucket(cfg.batch_tokens + 1), check)
                _reserve_full_step(r, family, cfg.batch_tokens, cfg.max_items_per_step)
        self._family, self._replicas, self._dtype = family, replicas, dtype
        self.overlaps_tokenizing = cfg.overlap_tokenizing == "on" or (
            cfg.overlap_tokenizing == "auto" and all(r.graphs is not None for r in replicas)
        )
        self._scheduler = PackedScheduler(
            replicas,
            batch_tokens=cfg.batch_tokens,
            max_items=cfg.max_items_per_step,
            policy=cfg.policy,
            error_type=EngineError,
        )


def _warm_up(replica: PackedPairReplica, family: CrossEncoderFamily) -> tuple[list[list[int]], list[int | None]]:
    """One pair and several: both shape specializations get compiled now, not on a request.
    Returns the several (what ``use_graphs`` checks a replay on)."""
    pair = family.tokenizer
    shared = pair.encode_shared("warm-up query", "")
    docs = pair.encode_documents(["a short document", "a somewhat longer document " * 4, "x"])
    rows = [pair.row(shared, d) for d in docs]
    prompts = [r.ids for r in rows]
    segments = [r.segment_start for r in rows]
    replica.warm_up(
        [(prompts[:1], segments[:1]), (prompts, segments), (prompts[1:], segments[1:]), (prompts[:1], segments[:1])]
    )
    return [list(p) for p in prompts], segments


def full_step(
    family: CrossEncoderFamily, batch_tokens: int, max_items: int
) -> tuple[list[list[int]], list[int | None]]:
    """Pairs of window-long prompts filling one step of ``batch_tokens`` (at most ``max_items`` pairs)."""
    pair = family.tokenizer
    shared = pair.encode_shared("warm-up query", "")
    word = pair.encode_documents(["warm-up document"])[0] or shared[-1:]
    room = max(1, min(pair.item_room(shared), batch_tokens - len(shared) - pair.suffix_length))
    row = pair.row(shared, (word * (room // len(word) + 1))[:room])
    count = max(1, min(max_items, batch_tokens // len(row.ids)))
    return [list(row.ids)] * count, [row.segment_start] * count


def _reserve_full_step(
    replica: PackedPairReplica, family: CrossEncoderFamily, batch_tokens: int, max_items: int
) -> None:
    """Run one step as large as the scheduler will ever build, so CUDA's caching allocator holds
    blocks for it from the start: a request larger than every earlier one otherwise pays for
    fresh device allocations on its own latency (a tail of the idle d100 runs, where the first
    requests keep setting new maxima). Under load such steps run anyway; a device too small for
    one is left to fail that step later, as before. With CUDA graphs on, this step captures the
    largest bucket's graph first, so the graphs' shared pool is sized for it before the smaller
    ones reuse its blocks."""
    prompts, segments = full_step(family, batch_tokens, max_items)
    try:
        replica.score(prompts, segments)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()


def _golden_scores(
    replica: PackedPairReplica, family: CrossEncoderFamily, batch_tokens: int, golden: list[GoldenQuery]
) -> list[list[float]]:
    """The golden set's scores (the family's score rule on the head's logits), pairs packed into
    steps of at most ``batch_tokens`` tokens as the scheduler packs them. A document longer than
    the window is cut to it, as ``truncate`` would: the gate compares one score per document."""
    pair = family.tokenizer
    out: list[list[float]] = []
    for item in golden:
        shared = pair.encode_shared(item.query, "")
        room = pair.item_room(shared)
        docs = [d[:room] for d in pair.encode_documents(item.documents)]
        rows = [pair.row(shared, d) for d in docs]
        logits: list[list[float]] = []
        start = 0
        while start < len(rows):
            end, tokens = start, 0
            while end < len(rows) and (end == start or tokens + len(rows[end].ids) <= batch_tokens):
                tokens += len(rows[end].ids)
                end += 1
            logits += replica.score([r.ids for r in rows[start:end]], [r.segment_start for r in rows[start:end]])
            start = end
        job = ScoreJob(query=item.query, instruction="", shared_ids=shared, item_ids=docs)
        out.append(family.scores(job, logits))
    return out


def _to_fp8(
    replicas: list[PackedPairReplica], family: CrossEncoderFamily, cfg: PackedEngineConfig, golden: list[GoldenQuery]
) -> gate.GateResult:
    """Quantize every replica; the first one's golden-set ranking against its bf16 self decides
    (``gate``: the rule Qwen3's FP8 is admitted by). Refuses unless ``precision_gate = "warn"``."""
    # Fixed intra-op threads for both passes (parity.fixed_threads): on a CPU "device" a reduction's
    # order follows the thread count, which is process state; on a GPU it costs nothing.
    with fixed_threads():
        base = _golden_scores(replicas[0], family, cfg.batch_tokens, golden)
    for r in replicas:
        if not isinstance(r, PackedEncoderReplica):  # ModernBERT: packed_encoder_refusal refused it already
            raise EngineConfigError(f"model '{cfg.name}': precision = 'fp8' is not built for {r.model_type}")
        r.to_fp8()
        _warm_up(r, family)
    with fixed_threads():
        cand = _golden_scores(replicas[0], family, cfg.batch_tokens, golden)
    result = gate.judge(
        "fp8",
        base,
        cand,
        tie=cfg.parity_tie,
        min_agreement=cfg.parity_min_agreement,
        golden=cfg.parity_set or "generated",
    )
    if not result.passed and cfg.precision_gate == "refuse":
        raise EngineConfigError(
            f"model '{cfg.name}': {result.line()}: refused; serve it in bf16 (drop precision) "
            f"or set precision_gate = 'warn' after checking the ranking on your own data"
        )
    # a failed gate served anyway (precision_gate = "warn") is a warning in the log, as in /ready
    (log.info if result.passed else log.warning)(
        "packed_fp8_gate", model=cfg.name, passed=result.passed, line=result.line()
    )
    return result


async def _scores_of(scheduler: PackedScheduler, req: Any) -> list[Any]:
    """The request's logits; a cancelled wait (timeout, client gone) drops its items no step has taken."""
    try:
        return await req.future
    except asyncio.CancelledError:
        scheduler.cancel(req)
        raise
