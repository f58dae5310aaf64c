"""The ``packed`` engine: Qwen3-Reranker packed without padding, continuous batching, one or more devices.

Engine kind ``packed`` serves two families: ``build.build_packed_engine`` (what the registry
calls) gives a cross-encoder to ``encoder.PackedEncoderEngine`` and everything else to
:class:`PackedQwen3Engine` below, which refuses what it cannot run at start. What both engines
share (:class:`PackedEngineBase`, :func:`resolve_devices`) is here too.

Same prompts as every other Qwen3 engine (``adapters.families.qwen3``), same scores (tests
check it against the independent reference); what differs is how the work is run:
``forward.PackedQwen3Replica`` (varlen, last positions only) on each device of ``devices``,
fed by ``scheduler.PackedScheduler`` (steps filled from all waiting requests); with
``split = "pipeline"`` one replica instead, its layers spread over the devices (``pipeline``).
"""

from __future__ import annotations

import abc
import asyncio
from typing import Any

import anyio.to_thread
import msgspec
import torch

from adapters.base import EngineConfigError, EngineError, EngineUnavailableError, ScoreJob, ScoreResult
from adapters.families import resolve_for_runtime
from adapters.families.base import WEIGHTS_LOCK
from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
from adapters.runtimes.packed import gate, pipeline
from adapters.runtimes.packed.forward import PackedQwen3Replica, load_backbone
from adapters.runtimes.packed.scheduler import PackedScheduler
from adapters.runtimes.parity import GoldenQuery, fixed_threads, golden_set_or_refuse
from schemas.config import DEFAULT_INSTRUCTION, PackedEngineConfig

__all__ = ("PackedEngineBase", "PackedQwen3Engine", "resolve_devices")


def resolve_devices(names: tuple[str, ...]) -> list[torch.device]:
    out = []
    for name in names:
        if name == "auto":
            name = "cuda:0" if torch.cuda.is_available() else "cpu"
        dev = torch.device(name)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", 0)
        out.append(dev)
    if len({str(d) for d in out if d.type == "cuda"}) != sum(d.type == "cuda" for d in out):
        raise ValueError(f"devices {list(names)}: a GPU is listed twice")
    return out


class PackedEngineBase(abc.ABC):
    """What both packed engines share (this one and ``encoder.PackedEncoderEngine``): replicas
    loaded by ``_load`` in a worker thread, fed by one scheduler, released on stop."""

    _scheduler: PackedScheduler | None
    _replicas: list[Any]

    @abc.abstractmethod
    def _load(self) -> None:
        """Worker-thread code: load the model, build and warm the replicas and the scheduler."""

    def _unload(self) -> None:
        """What else the loaded model held (the engine's tokenizer...), dropped on stop."""

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._load)

    async def stop(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            await anyio.to_thread.run_sync(scheduler.stop)
        self._replicas = []
        self._unload()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def check_health(self) -> None:
        if self._scheduler is None:
            raise EngineUnavailableError("model is not loaded")

    def queue_depth(self) -> int:
        """Requests waiting for their first step (``rerank_queued_requests``, a chain's spill-over)."""
        return self._scheduler.queue_depth() if self._scheduler is not None else 0

    def expected_wait_s(self) -> float:
        """The scheduler's :meth:`~adapters.runtimes.packed.scheduler.PackedScheduler.expected_wait_s`."""
        return self._scheduler.expected_wait_s() if self._scheduler is not None else 0.0

    def _stats(self, base: dict[str, Any]) -> dict[str, Any]:
        """``base`` with the kernels every replica reports, a compile error, and the scheduler's counters."""
        out: dict[str, Any] = {
            "attention": self._replicas[0].attention_name if self._replicas else None,
            "compiled": bool(self._replicas and self._replicas[0].compiled),
            **base,
        }
        errors = [r.compile_error for r in self._replicas if r.compile_error]
        if errors:
            out["compile_error"] = errors[0]
        if self._scheduler is not None:
            out.update(self._scheduler.stats())
        return out


class PackedQwen3Engine(PackedEngineBase):
    """:class:`adapters.base.RerankEngine` with one model replica per configured device."""

    def __init__(self, config: PackedEngineConfig) -> None:
        self._config = config
        self._prompt: Qwen3PromptTokenizer | None = None
        self._scheduler: PackedScheduler | None = None
        self._replicas: list[PackedQwen3Replica] = []
        self._gate: gate.GateResult | None = None

    @property
    def tokenizer(self) -> Qwen3PromptTokenizer | None:
        return self._prompt

    def _unload(self) -> None:
        self._prompt = None

    def stats(self) -> dict[str, Any]:
        """Shown by ``/ready`` per model: each device, steps, requests per step, queue and step times."""
        base: dict[str, Any] = {
            "devices": [{"device": str(r.device)} for r in self._replicas],
            "mode": self._replicas[0].mode if self._replicas else None,
            "silu": (
                {"kernel": self._replicas[0].silu_kernel, "timing_ms": self._replicas[0].silu_timing_ms}
                if self._replicas
                else None
            ),
            "qk_norm_rope": (
                {"kernel": self._replicas[0].qk_kernel, "timing_ms": self._replicas[0].qk_timing_ms}
                if self._replicas
                else None
            ),
            # configured, and why not in effect if so (an attention kernel failing the bottom-right check)
            "prefix_sharing": {
                "configured": self._config.share_prefix,
                "not_shared_because": next((r.share_error for r in self._replicas if r.share_error), None),
            },
        }
        if self._replicas and self._replicas[0].mm_kernel:
            base["precision"] = {
                "mode": self._replicas[0].precision,
                "gemm": self._replicas[0].mm_kernel,
                "gemm_timing": self._replicas[0].mm_timing,
                "quantizing_regions": self._replicas[0].fp8_kernels,
                "gate": msgspec.structs.asdict(self._gate) if self._gate else None,
            }
        if self._config.split == "pipeline" and self._replicas:
            base["split"] = {"mode": "pipeline", "stages": pipeline.describe(self._replicas[0])}
        return self._stats(base)

    async def score(self, job: ScoreJob) -> ScoreResult:
        prompt, scheduler = self._prompt, self._scheduler
        if prompt is None or scheduler is None:
            raise EngineUnavailableError("model is not loaded")
        req = scheduler.submit(job.shared_ids, job.item_ids, prompt.suffix_ids)
        try:
            scores = await req.future
        except asyncio.CancelledError:
            # Timeout or client gone: the items no step has taken are dropped.
            scheduler.cancel(req)
            raise
        tokens = sum(req.prompt_len(i) for i in range(len(job.item_ids)))
        return ScoreResult(scores=scores, input_tokens=tokens)

    # -- worker-thread code ----------------------------------------------------------------
    def _load(self) -> None:
        cfg = self._config
        devices = resolve_devices(cfg.devices)
        on_gpu = devices[0].type == "cuda"
        if cfg.precision == "fp8":  # the unquantized parts and the gate's reference run in bf16
            if cfg.dtype not in ("auto", "bfloat16"):
                raise EngineConfigError(
                    f"model '{cfg.name}': precision = 'fp8' runs the rest of the model in bfloat16; "
                    f"drop dtype = '{cfg.dtype}' or precision"
                )
            dtype = torch.bfloat16
        elif cfg.dtype != "auto":
            dtype = getattr(torch, cfg.dtype)
        elif on_gpu:
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            dtype = torch.float32
        # The packed kernels run Qwen3 only: a detected Gemma or Qwen2 reranker (family = "auto")
        # would fail deep in the fused layers, or worse, be scored with Qwen3's prompt.
        detection, _ = resolve_for_runtime(cfg, "packed")
        if (
            detection.family != "qwen3"
        ):  # a cross-encoder goes to encoder.PackedEncoderEngine (build.build_packed_engine)
            raise EngineConfigError(
                f"model '{cfg.name}': {detection.family} model given to the Qwen3 packed engine; "
                "restart the model (its family is read when the engine is built)"
            )
        if cfg.gelu_epilogue == "on":
            raise EngineConfigError(
                f"model '{cfg.name}': gelu_epilogue = 'on' is for cross-encoders; Qwen3's MLP is gated (SiLU): drop it"
            )
        golden = golden_set_or_refuse(cfg.name, cfg.parity_set, gate.golden_set) if cfg.precision == "fp8" else []
        prompt = Qwen3PromptTokenizer(
            load_hf_tokenizer(cfg.path, cfg.revision),
            max_length=cfg.max_length,
            max_query_tokens=cfg.max_query_tokens,
            tokenize_threads=cfg.tokenize_threads,
        )
        # transformers 5 loads weights under process-wide init contexts (meta device): two packed
        # models loading in parallel failed with "Cannot copy out of meta tensor" on the H200.
        with WEIGHTS_LOCK:
            backbone, head = load_backbone(cfg.path, cfg.revision, dtype, (prompt.no_id, prompt.yes_id))
        # Compiling fuses the elementwise work between the GEMMs (~2x on an H200); on CPU it only
        # costs start time (the CPU benchmark, docs/benchmarks.md), so "auto" compiles on CUDA only.
        compile_ = cfg.compile == "on" or (cfg.compile == "auto" and on_gpu)
        if cfg.split == "pipeline":  # one replica whose layers are spread over every device
            try:
                replicas = [
                    pipeline.build_pipeline(
                        backbone, head, devices, cfg.split_layers, attention=cfg.attention, compile=compile_
                    )
                ]
            except pipeline.SplitError as exc:
                raise EngineConfigError(f"model '{cfg.name}': {exc}") from None
        else:
            replicas = PackedQwen3Replica.replicas(backbone, head, devices, attention=cfg.attention, compile=compile_)
        for r in replicas:  # compile and warm every replica before traffic (one at a time)
            _warm_up(r, prompt, cfg.share_prefix)
        share = cfg.share_prefix and all(r.can_share for r in replicas)
        if cfg.precision == "fp8":
            self._gate = _to_fp8(replicas, prompt, cfg, share, golden)
        self._replicas = replicas
        self._scheduler = PackedScheduler(
            replicas,
            batch_tokens=cfg.batch_tokens,
            max_items=cfg.max_items_per_step,
            policy=cfg.policy,
            error_type=EngineError,
            share_prefix=share,
        )
        self._prompt = prompt


def _warm_up(replica: PackedQwen3Replica, prompt: Qwen3PromptTokenizer, share: bool) -> None:
    """One prompt and several: both shape specializations get compiled now, not on a request
    (and with ``share`` the shared-prefix steps: one document, several, two requests)."""
    shared = prompt.encode_shared("warm-up query", "warm-up")
    docs = prompt.encode_documents(["a short document", "a somewhat longer document " * 4, "x"])
    prompts = [prompt.assemble(shared, d) for d in docs]
    tails = [[*d, *prompt.suffix_ids] for d in docs]
    other = prompt.encode_shared("another warm-up query", "warm-up")
    groups = [[(shared, tails[:1])], [(shared, tails)], [(shared, tails[1:]), (other, tails[:2])]] if share else []
    replica.warm_up([prompts[:1], prompts, prompts[1:], prompts[:1]], groups)


def _golden_scores(
    replica: PackedQwen3Replica,
    prompt: Qwen3PromptTokenizer,
    batch_tokens: int,
    share: bool,
    golden: list[GoldenQuery],
    instruction: str = DEFAULT_INSTRUCTION,
) -> list[list[float]]:
    """The golden set's scores, queries packed together into steps of at most ``batch_tokens``
    computed tokens, as the scheduler packs them (``share``: each query's prefix once per step),
    with the instruction a request without one gets (the model's configured one, else Qwen3's).
    A document longer than the window (an operator's own set may hold some) is cut to it, as
    ``truncate`` would: the gate compares one score per document, not chunks."""
    per_query = []
    for item in golden:
        shared = prompt.encode_shared(item.query, instruction)
        room = prompt.item_room(shared)
        per_query.append((shared, [[*d[:room], *prompt.suffix_ids] for d in prompt.encode_documents(item.documents)]))
    scores: list[float] = []
    step: list[tuple[list[int], list[list[int]]]] = []
    tokens = 0

    def run() -> list[float]:
        if share:
            return replica.score_groups(step)
        return replica.score([[*pre, *t] for pre, tails in step for t in tails])

    for shared, tails in per_query:
        for t in tails:
            new_group = not (step and step[-1][0] is shared)
            cost = len(t) + (len(shared) if new_group or not share else 0)
            if step and tokens + cost > batch_tokens:
                scores += run()
                step, tokens = [], 0
                new_group, cost = True, len(t) + len(shared)
            if new_group:
                step.append((shared, []))
            step[-1][1].append(t)
            tokens += cost
    scores += run()
    out, i = [], 0
    for _, tails in per_query:
        out.append(scores[i : i + len(tails)])
        i += len(tails)
    return out


def _to_fp8(
    replicas: list[PackedQwen3Replica],
    prompt: Qwen3PromptTokenizer,
    cfg: PackedEngineConfig,
    share: bool,
    golden: list[GoldenQuery],
) -> gate.GateResult:
    """Quantize every replica; the first one's golden-set ranking against its bf16 self decides
    (both scored the way the engine will serve: prefixes shared or not)."""
    instruction = cfg.instruction if cfg.instruction is not None else DEFAULT_INSTRUCTION
    # Fixed intra-op threads for both passes (parity.fixed_threads): on a CPU "device" a reduction's
    # order follows the thread count, which is process state; on a GPU it costs nothing.
    with fixed_threads():
        base = _golden_scores(replicas[0], prompt, cfg.batch_tokens, share, golden, instruction)
    for r in replicas:
        r.to_fp8()
        _warm_up(r, prompt, share)
    with fixed_threads():
        cand = _golden_scores(replicas[0], prompt, cfg.batch_tokens, share, golden, instruction)
    result = gate.judge(
        "fp8",
        base,
        cand,
        tie=cfg.parity_tie,
        min_agreement=cfg.parity_min_agreement,
        golden=cfg.parity_set or "generated",
    )
    if torch.cuda.is_available():  # the gate's 65k-token steps: do not keep their activations cached
        torch.cuda.empty_cache()
    if not result.passed and cfg.precision_gate == "refuse":
        raise EngineConfigError(
            f"model '{cfg.name}': {result.line()}: refused; serve it in bf16 (drop precision) "
            f"or set precision_gate = 'warn' after checking the ranking on your own data"
        )
    return result
