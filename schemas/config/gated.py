"""The in-process engines whose reduced precision a parity gate admits: transformers (bf16 /
fp16 on a CPU), packed (FP8) and openvino (bf16 / int8).

``GatedPrecisionConfig`` holds the gate's keys, the same on each: the share of golden queries
that must keep the reference precision's top-10 order, the tie below which a swap does not
count, the operator's own golden set or judgements. The gates run at load, in the adapters
(``adapters/runtimes/parity.py`` and ``qrels_gate.py``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .base import Positive
from .local import DtypeAlias, LocalModelConfig, _precision_as_dtype

__all__ = (
    "PARITY_MIN_AGREEMENT",
    "PARITY_TIE",
    "PARITY_TOP_K",
    "GatedPrecisionConfig",
    "OpenVinoEngineConfig",
    "PackedEngineConfig",
    "TransformersEngineConfig",
)


# The parity gate (adapters/runtimes/parity.py) admits a reduced precision -- OpenVINO's bf16 /
# int8 and transformers' bf16 / fp16 on CPU against fp32, packed FP8 against bf16 -- on each
# golden query's top this-many order ...
PARITY_TOP_K = 10
# ... kept by at least this share of the queries (the default of parity_min_agreement) ...
PARITY_MIN_AGREEMENT = 0.99
# ... swaps of documents whose reference scores differ by less than this aside (parity_tie).
PARITY_TIE = 1e-3
ParityShare = Annotated[float, msgspec.Meta(gt=0, le=1)]
ParityTie = Annotated[float, msgspec.Meta(ge=0)]


class GatedPrecisionConfig(LocalModelConfig, frozen=True):
    """A local model whose engine offers a reduced precision, admitted by the parity gate
    (adapters/runtimes/parity.py): the keys of the gate's rule, the same on every such engine."""

    # The share of golden queries that must keep the reference precision's top-10 order (fp32's;
    # bf16's for packed FP8) ...
    parity_min_agreement: ParityShare = PARITY_MIN_AGREEMENT
    # ... not counting swaps of documents whose reference scores differ by less than this (ones the
    # model itself cannot tell apart) ...
    parity_tie: ParityTie = PARITY_TIE
    # ... on a JSON Lines file of {"query": ..., "documents": [...]} from your own traffic (the
    # verdict that means most), instead of the engine's generated set; read before any weights load.
    parity_set: str | None = None
    # Or your own judgements (transformers and openvino): a BEIR directory (corpus.jsonl,
    # queries.jsonl, qrels/<qrels_split>.tsv). The reduced precision is then admitted on nDCG@10
    # instead of the top-10 order: only if it is within qrels_tolerance (relative) of fp32's
    # ("Evaluate and choose" in the docs).
    qrels_set: str | None = None
    qrels_split: str = "test"  # see qrels_set
    qrels_tolerance: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.005  # see qrels_set

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.qrels_set is not None and self.parity_set is not None:
            raise ValueError(
                "parity_set and qrels_set are two rules of the same gate (the top-10 order of your "
                "queries, or nDCG@10 on your judgements): keep one"
            )
        if self.qrels_set is not None and str(type(self).__struct_config__.tag) == "packed":
            raise ValueError(
                "qrels_set is read by the transformers and openvino gates; packed FP8 is admitted on the "
                "top-10 order: use parity_set"
            )


class TransformersEngineConfig(GatedPrecisionConfig, tag="transformers", frozen=True):
    """In-process Hugging Face transformers, CPU or CUDA: length-sorted batches in worker threads."""

    device: str = "auto"  # "auto" (CUDA if available), "cpu", "cuda", "cuda:1", ...
    # "auto": float32 on CPU, bfloat16 on CUDA (float16 where bfloat16 is unsupported).
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Another name for dtype, as the openvino and packed engines spell it: "fp32", "bf16", "fp16".
    precision: DtypeAlias | None = None
    # Padded tokens (longest prompt x rows) per forward pass, and rows per pass.
    batch_tokens: Positive = 16_384
    max_batch_size: Positive = 64  # rows per forward pass
    # Forward passes running at once in worker threads (torch already uses every core).
    max_parallel_batches: Positive = 1
    # Listwise families (jina-v3): documents per model.rerank call (the old service's batch_size;
    # 64 was its T4 advice, 125 stays closer to one full listwise window at more latency).
    block_size: Positive = 64
    # dtype = "bfloat16" / "float16" on a CPU is a reduced precision, kept only if it keeps fp32's
    # ranking (adapters/runtimes/parity.py, OpenVINO's rule): at start a golden set is scored in
    # fp32 and in dtype. A failed gate "refuse"s the model in one line, or "warn": serve it anyway.
    precision_gate: Literal["refuse", "warn"] = "refuse"
    # The generated golden set's queries (ten words each) ...
    parity_queries: Positive = 32
    # ... and documents per query, graded one by one (the j-th holds 10 - j of its query's words).
    parity_documents: Annotated[int, msgspec.Meta(ge=10)] = 30

    def __post_init__(self) -> None:
        super().__post_init__()
        _precision_as_dtype(self, self.precision, reset_to=None)
        if self.parity_set is not None and self.dtype == "float32":
            raise ValueError(
                "parity_set is the golden set of the parity gate of dtype = 'bfloat16' / 'float16' on a "
                "CPU, read only then; set dtype or drop parity_set"
            )
        if self.qrels_set is not None and self.dtype == "float32":
            raise ValueError(
                "qrels_set judges dtype = 'bfloat16' / 'float16' on a CPU against fp32, read only then; "
                "set dtype or drop qrels_set"
            )


class PackedEngineConfig(GatedPrecisionConfig, tag="packed", frozen=True):
    """Qwen3-Reranker or a cross-encoder (BERT, ELECTRA, RoBERTa, XLM-R) packed without padding
    into varlen steps filled from every waiting request."""

    # One model replica per device, all fed from one queue: ["cuda:0", "cuda:1"]; "auto": cuda:0, else cpu.
    # With split = "pipeline": the devices one model's layers are divided over, in order.
    devices: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)] = ("auto",)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # "auto": float32 on CPU, bfloat16 on CUDA
    # Tokens computed per step (one forward pass) on a device (with share_prefix a request's shared
    # prefix counts once per step); a longer prompt gets a step alone.
    batch_tokens: Positive = 16_384
    max_items_per_step: Positive = 1024  # prompts per step
    # Compute each request's shared prompt part (system + instruction + query) once per step, its
    # documents' tokens attending to it, instead of once per document (same scores, fewer GEMMs).
    share_prefix: bool = True
    # Which waiting request fills a step first: arrival order, or fewest tokens left.
    policy: Literal["fifo", "shortest-first"] = "fifo"
    # torch.compile(dynamic=True) of the pointwise work between the GEMMs; "auto": on CUDA only.
    compile: Literal["auto", "on", "off"] = "auto"
    # Cross-encoders on CUDA: "auto" replays each step as one captured CUDA graph (steps padded to a
    # few shape buckets, ~3 % padding; checked against the eager forward at start, eager if not
    # equal) instead of launching ~300 kernels from Python; an idle step spares itself a capture
    # where a slightly larger graph holds it (adapters/runtimes/packed/graphs.py); "off": launch
    # eagerly. Qwen3 launches eagerly.
    cuda_graphs: Literal["auto", "off"] = "auto"
    # Cross-encoders (BERT, ELECTRA, RoBERTa, XLM-R): the MLP's bias + GELU (or ReLU) computed in
    # its up-projection GEMM's epilogue (cuBLASLt), so the 4x-wide activation is written once: ~13 %
    # less device time per XLM-R large step on an H200. That epilogue's GELU is the tanh
    # approximation (within 5e-4 of the exact one). "auto": in bfloat16 / float16 on CUDA, where
    # bf16 rounding is larger; "on": on every device and dtype; "off": the activation on its own.
    gelu_epilogue: Literal["auto", "on", "off"] = "auto"
    # Cross-encoders: a request of 64+ distinct documents that is the model's only one in flight is
    # tokenized and submitted in three growing parts (12/33/55 % of the documents), the device
    # starting on each while the next is tokenized (same scores, errors and usage as one job).
    # "auto": where steps are replayed as CUDA graphs (one launch each; with ~300 launches from
    # Python per step a part's launch cost more than it hid: report gpu-h200-2026-12-01-e);
    # "on": always; "off": one job.
    overlap_tokenizing: Literal["auto", "on", "off"] = "auto"
    # "auto": varlen flash attention on CUDA (vLLM's FA3 when vLLM is installed, else flash-attn or
    # PyTorch's varlen_attn), exact per-prompt SDPA on CPU.
    attention: Literal["auto", "varlen", "sdpa"] = "auto"
    # "fp8": the GEMMs in e4m3 (weights quantized at load, one scale per output channel; activations
    # per token), attention and norms in bf16. Kept only if bf16's top-10 order survives on >= 99 %
    # of a golden set's queries, checked at load (adapters/runtimes/packed/gate.py). "auto": `dtype`.
    # Qwen3 rerankers and BERT / ELECTRA / RoBERTa / XLM-R cross-encoders (their four linear layers
    # per encoder layer; embeddings, attention, LayerNorms and the head in bf16); not ModernBERT.
    # "fp32", "bf16", "fp16" are another way to write dtype.
    precision: Literal["auto", "fp8", "fp32", "bf16", "fp16"] = "auto"
    # A failed gate: "refuse" the model (one line saying by how much), or "warn": serve it anyway
    # (for an operator who has checked the ranking on their own data); /ready shows the gate's figures.
    precision_gate: Literal["refuse", "warn"] = "refuse"
    # "pipeline": ONE model split over all of `devices` (two or more, in order), each holding a
    # contiguous range of the layers, one step in flight per device; for a model that does not fit
    # one device. "none": a whole replica per device (data parallel: faster whenever it fits).
    split: Literal["none", "pipeline"] = "none"
    # With split = "pipeline": decoder layers per device, in the order of `devices` (e.g. [19, 17]
    # for a faster first GPU); they must add up to the model's layers. None: as even as possible.
    split_layers: tuple[Positive, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _precision_as_dtype(self, self.precision, reset_to="auto")
        if self.split == "pipeline" and len(self.devices) < 2:
            raise ValueError(
                f"split = 'pipeline' needs at least 2 devices, got devices = {list(self.devices)}; "
                f'list them, e.g. ["cuda:0", "cuda:1"], or drop split'
            )
        if self.split_layers is not None and self.split != "pipeline":
            raise ValueError("split_layers is only read with split = 'pipeline'; set split or drop split_layers")
        if self.split_layers is not None and len(self.split_layers) != len(self.devices):
            raise ValueError(
                f"split_layers has {len(self.split_layers)} entries for {len(self.devices)} devices; "
                f"give one layer count per device"
            )
        if self.family == "cross-encoder" and self.split != "none":
            raise ValueError(
                "split = 'pipeline' is for Qwen3 rerankers on engine 'packed'; a cross-encoder fits one "
                "device: list several devices for one replica each"
            )
        if self.family == "qwen3" and self.gelu_epilogue == "on":
            raise ValueError(
                "gelu_epilogue = 'on' is for cross-encoders on engine 'packed'; Qwen3's MLP is gated (SiLU)"
            )
        if self.parity_set is not None and self.precision != "fp8":
            raise ValueError(
                "parity_set is the golden set of the FP8 ranking gate, read only with precision = 'fp8'; "
                "set precision or drop parity_set"
            )


class OpenVinoEngineConfig(GatedPrecisionConfig, tag="openvino", frozen=True):
    """Encoder families (cross-encoder, bi-encoder) on OpenVINO's CPU plugin.

    The checkpoint is exported to OpenVINO IR on first load and cached on disk (keyed by the
    weights' hash, the export options and the library versions); the gateway still tokenizes,
    truncates, chunks and dedups. Measured against the other CPU runtimes in docs/cpu-runtimes.md.
    """

    # "fp32": equals the transformers engine (and sentence-transformers) within 1e-4.
    # "bf16" / "int8": faster, admitted only when the parity gate below keeps the ranking.
    precision: Literal["fp32", "bf16", "int8"] = "fp32"
    # Where exported models live; None: $XDG_CACHE_HOME/rerank-gateway/openvino (~/.cache/...).
    cache_dir: str | None = None
    # CPU threads in all (None: the cores this process may run on).
    threads: Positive | None = None
    # Inferences in flight at once, each on its share of the threads (None: what OpenVINO's
    # throughput hint picks).
    streams: Positive | None = None
    # Rows are sorted by length and cut into batches of at most this many padded tokens
    # (small batches of near-equal lengths: no padding waste, and every stream gets work).
    batch_tokens: Positive = 2048
    # ... and at most this many rows per batch.
    max_batch_size: Positive = 16
    # "shared": a free stream's batch takes rows of neighbouring lengths from the oldest waiting
    # requests together (less padding under concurrency; a row's score may move ~1e-7 with its
    # batch). "per-request": batches never mix requests (scores repeat exactly whatever else runs).
    batching: Literal["shared", "per-request"] = "shared"
    # Parity gate of bf16 / int8, run at start: a golden set of this many queries is scored in
    # fp32 and in the reduced precision.
    parity_queries: Positive = 32
    # Documents per golden query.
    parity_documents: Annotated[int, msgspec.Meta(ge=10)] = 30
    # bf16 / int8 only: re-score in fp32 the documents the reduced precision cannot order within
    # each request's top this-many (their reduced scores closer to a neighbour's than twice the
    # error measured at start), so that top order is fp32's; 0: off, else at least 10 (the gate's
    # top-10, which it checks the result on).
    refine_top: Annotated[int, msgspec.Meta(ge=0)] = 0
    # The error bound refinement trusts: this many times the largest score change measured at
    # start on calibration queries (not the golden ones the gate then checks).
    refine_margin: Annotated[float, msgspec.Meta(ge=0)] = 1.5
    # Rounds of fp32 re-scoring per request: 1 re-scores both sides of every pair the bound leaves
    # open at once; more re-score one side first (an exact score settles most pairs) and look again,
    # the last round taking every side left (docs/cpu-runtimes.md; fewer documents, more steps).
    refine_rounds: Annotated[int, msgspec.Meta(ge=1)] = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.parity_set is not None and self.precision == "fp32":
            raise ValueError(
                "parity_set is the golden set of the bf16 / int8 parity gate, read only with precision = "
                "'bf16' or 'int8'; set precision or drop parity_set"
            )
        if self.qrels_set is not None and self.precision == "fp32":
            raise ValueError(
                "qrels_set judges precision = 'bf16' / 'int8' against fp32, read only then; set precision "
                "or drop qrels_set"
            )
        if self.refine_top and self.precision == "fp32":
            raise ValueError(
                "refine_top re-scores a reduced precision's uncertain documents in fp32; with "
                "precision = 'fp32' every score already is: set precision = 'bf16' or 'int8', or drop refine_top"
            )
        if 0 < self.refine_top < PARITY_TOP_K:
            # Below the gate's top-10 the gate would refuse (or admit) on documents refinement never ordered.
            raise ValueError(
                f"refine_top = {self.refine_top}: the parity gate admits a reduced precision on the fp32 "
                f"top-{PARITY_TOP_K} order, which refining fewer documents does not keep; set refine_top "
                f">= {PARITY_TOP_K}, or 0 (off)"
            )
