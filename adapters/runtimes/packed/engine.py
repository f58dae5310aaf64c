"""The ``packed`` engine: Qwen3-Reranker packed without padding, continuous batching, one or more devices.

Same prompts as every other Qwen3 engine (``adapters.families.qwen3``), same scores (tests
check it against the independent reference); what differs is how the work is run:
``forward.PackedQwen3Replica`` (varlen, last positions only) on each device of ``devices``,
fed by ``scheduler.PackedScheduler`` (steps filled from all waiting requests); with
``split = "pipeline"`` one replica instead, its layers spread over the devices (``pipeline``).
"""

from __future__ import annotations

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
from schemas.config import DEFAULT_INSTRUCTION, PackedEngineConfig

__all__ = ("PackedQwen3Engine", "resolve_devices")


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


class PackedQwen3Engine:
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

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._load)

    async def stop(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            await anyio.to_thread.run_sync(scheduler.stop)
        self._replicas = []
        self._prompt = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def check_health(self) -> None:
        if self._scheduler is None:
            raise EngineUnavailableError("model is not loaded")

    def stats(self) -> dict[str, Any]:
        """Shown by ``/ready`` per model: each device, steps, requests per step, queue and step times."""
        base: dict[str, Any] = {
            "devices": [{"device": str(r.device)} for r in self._replicas],
            "attention": self._replicas[0].attention_name if self._replicas else None,
            "compiled": bool(self._replicas and self._replicas[0].compiled),
            "mode": self._replicas[0].mode if self._replicas else None,
            "silu": ({"kernel": self._replicas[0].silu_kernel, "timing_ms": self._replicas[0].silu_timing_ms}
                     if self._replicas else None),
            "qk_norm_rope": ({"kernel": self._replicas[0].qk_kernel, "timing_ms": self._replicas[0].qk_timing_ms}
                             if self._replicas else None),
        }
        if self._replicas and self._replicas[0].mm_kernel:
            base["precision"] = {"mode": self._replicas[0].precision, "gemm": self._replicas[0].mm_kernel,
                                 "gemm_timing": self._replicas[0].mm_timing,
                                 "quantizing_regions": self._replicas[0].fp8_kernels,
                                 "gate": msgspec.structs.asdict(self._gate) if self._gate else None}
        if self._config.split == "pipeline" and self._replicas:
            base["split"] = {"mode": "pipeline", "stages": pipeline.describe(self._replicas[0])}
        errors = [r.compile_error for r in self._replicas if r.compile_error]
        if errors:
            base["compile_error"] = errors[0]
        if self._scheduler is not None:
            base.update(self._scheduler.stats())
        return base

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
                raise EngineConfigError(f"model '{cfg.name}': precision = 'fp8' runs the rest of the model in bfloat16; "
                                        f"drop dtype = '{cfg.dtype}' or precision")
            dtype = torch.bfloat16
        elif cfg.dtype != "auto":
            dtype = getattr(torch, cfg.dtype)
        elif on_gpu:
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            dtype = torch.float32
        # The packed kernels run Qwen3 only: a detected Gemma or Qwen2 reranker (family = "auto")
        # would fail deep in the fused layers, or worse, be scored with Qwen3's prompt.
        resolve_for_runtime(cfg, "packed")
        prompt = Qwen3PromptTokenizer(load_hf_tokenizer(cfg.path, cfg.revision), max_length=cfg.max_length,
                                      max_query_tokens=cfg.max_query_tokens)
        # transformers 5 loads weights under process-wide init contexts (meta device): two packed
        # models loading in parallel failed with "Cannot copy out of meta tensor" on the H200.
        with WEIGHTS_LOCK:
            backbone, head = load_backbone(cfg.path, cfg.revision, dtype, (prompt.no_id, prompt.yes_id))
        # Compiling fuses the elementwise work between the GEMMs (~2x on an H200); on CPU it only
        # costs start time (the CPU benchmark, docs/benchmarks.md), so "auto" compiles on CUDA only.
        compile_ = cfg.compile == "on" or (cfg.compile == "auto" and on_gpu)
        if cfg.split == "pipeline":  # one replica whose layers are spread over every device
            try:
                replicas = [pipeline.build_pipeline(backbone, head, devices, cfg.split_layers, attention=cfg.attention,
                                                    compile=compile_)]
            except pipeline.SplitError as exc:
                raise EngineConfigError(f"model '{cfg.name}': {exc}") from None
        else:
            replicas = PackedQwen3Replica.replicas(backbone, head, devices, attention=cfg.attention, compile=compile_)
        for r in replicas:  # compile and warm every replica before traffic (one at a time)
            _warm_up(r, prompt)
        if cfg.precision == "fp8":
            self._gate = _to_fp8(replicas, prompt, cfg)
        self._replicas = replicas
        self._scheduler = PackedScheduler(replicas, batch_tokens=cfg.batch_tokens, max_items=cfg.max_items_per_step,
                                          policy=cfg.policy, error_type=EngineError)
        self._prompt = prompt


def _warm_up(replica: PackedQwen3Replica, prompt: Qwen3PromptTokenizer) -> None:
    """One prompt and several: both shape specializations get compiled now, not on a request."""
    shared = prompt.encode_shared("warm-up query", "warm-up")
    docs = prompt.encode_documents(["a short document", "a somewhat longer document " * 4, "x"])
    prompts = [prompt.assemble(shared, d) for d in docs]
    replica.warm_up([prompts[:1], prompts, prompts[1:], prompts[:1]])


def _golden_scores(replica: PackedQwen3Replica, prompt: Qwen3PromptTokenizer, batch_tokens: int) -> list[list[float]]:
    """The golden set's scores, queries packed together into steps of at most ``batch_tokens``."""
    per_query = []
    for query, docs in gate.golden_set():
        shared = prompt.encode_shared(query, DEFAULT_INSTRUCTION)
        per_query.append([prompt.assemble(shared, d) for d in prompt.encode_documents(docs)])
    flat = [p for ps in per_query for p in ps]
    scores: list[float] = []
    step: list[list[int]] = []
    for p in flat:
        if step and sum(map(len, step)) + len(p) > batch_tokens:
            scores += replica.score(step)
            step = []
        step.append(p)
    scores += replica.score(step)
    out, i = [], 0
    for ps in per_query:
        out.append(scores[i:i + len(ps)])
        i += len(ps)
    return out


def _to_fp8(replicas: list[PackedQwen3Replica], prompt: Qwen3PromptTokenizer, cfg: PackedEngineConfig) -> gate.GateResult:
    """Quantize every replica; the first one's golden-set ranking against its bf16 self decides."""
    base = _golden_scores(replicas[0], prompt, cfg.batch_tokens)
    for r in replicas:
        r.to_fp8()
        _warm_up(r, prompt)
    result = gate.judge("fp8", base, _golden_scores(replicas[0], prompt, cfg.batch_tokens))
    if torch.cuda.is_available():  # the gate's 65k-token steps: do not keep their activations cached
        torch.cuda.empty_cache()
    if not result.passed and cfg.precision_gate == "refuse":
        raise EngineConfigError(f"model '{cfg.name}': {result.line()}: refused; serve it in bf16 (drop precision) "
                                f"or set precision_gate = 'warn' after checking the ranking on your own data")
    return result
