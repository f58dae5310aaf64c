"""Typed configuration: frozen msgspec structs decoded from TOML plus ``RERANK_*`` overrides.

Every struct forbids unknown fields so a typo fails at start with the field's path. A model
entry is a tagged union on ``engine``: the engine kind is a type, never a free string that code
compares against. Loading (file, env, defaults) lives in ``gateway.settings``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

__all__ = (
    "ApiKeyConfig",
    "AuthConfig",
    "CacheConfig",
    "DEFAULT_INSTRUCTION",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_PATH",
    "DashScopeEngineConfig",
    "DialectsConfig",
    "EngineConfig",
    "FAMILY_RUNTIMES",
    "FamilyName",
    "GgufEngineConfig",
    "LimitsConfig",
    "LocalModelConfig",
    "LoggingConfig",
    "ModelConfig",
    "OpenVinoEngineConfig",
    "PackedEngineConfig",
    "PoolEngineConfig",
    "Qwen3LocalConfig",
    "ServerConfig",
    "Settings",
    "StaticEngineConfig",
    "TransformersEngineConfig",
    "UpstreamHttpConfig",
    "VllmEngineConfig",
    "VllmGenerateEngineConfig",
    "VllmScoreEngineConfig",
)

DEFAULT_MODEL_PATH = "Qwen/Qwen3-Reranker-0.6B"
DEFAULT_MODEL_NAME = "qwen3-reranker-0.6b"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\s]+$")]


class _Strict(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    pass


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    # uvicorn is a hard dependency and the faster for a passthrough gateway (one client: granian
    # added 0.7-1.8 ms more, docs/benchmarks/cpu-2026-12-01-granian); granian is optional (extra `granian`).
    runner: Literal["uvicorn", "granian"] = "uvicorn"
    # Connection bounds (gateway.servers): no client holds a descriptor forever.
    keep_alive_timeout_s: PositiveFloat = 5.0  # idle connection, fresh or between requests
    header_read_timeout_s: PositiveFloat = 10.0  # a request's headers, from their first byte
    body_read_timeout_s: PositiveFloat = 30.0  # the whole body, from the headers (then 408)
    # SIGTERM: stop accepting, give in-flight requests this long to finish, then stop engines.
    shutdown_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # A model that failed to load is retried with capped exponential backoff: after
    # load_retry_initial_s, then twice as long each time, at most load_retry_max_s apart.
    load_retry_initial_s: PositiveFloat = 5.0
    load_retry_max_s: PositiveFloat = 300.0
    # Liveness (/health) answers 503 once every model has been failed or unhealthy this long,
    # so an orchestrator restarts the process; 0 keeps /health 200 whatever the models do.
    liveness_failure_after_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    # Server processes sharing the port. Above 1, per-key limits are per worker unless
    # limits.redis_url is set, and /metrics sums every worker (prometheus multiprocess mode).
    workers: Positive = 1


class LoggingConfig(_Strict):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "json"


class LimitsConfig(_Strict):
    max_body_bytes: Positive = 20 * 1024 * 1024
    max_documents: Positive = 10_000
    # Cohere caps documents x chunks at 10,000; we cap the chunks actually produced.
    max_total_chunks: Positive = 10_000
    # Per-key rate limits live in this Redis when set (shared by every replica), else in memory.
    redis_url: str | None = None
    # Redis unreachable: "closed" answers 503, "open" falls back to this process's own counters.
    redis_failure: Literal["open", "closed"] = "closed"
    redis_timeout_s: PositiveFloat = 0.5


KeyId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
KeyHash = Annotated[str, msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}$")]


class ApiKeyConfig(_Strict):
    """One API key, stored as the SHA-256 of the key (``rerank-gateway keys create``), never the key."""

    id: KeyId  # shown in logs, metrics and errors instead of the key
    hash: KeyHash
    # Canonical model names or globs ("qwen3-*", "*"); aliases are resolved before matching.
    models: Annotated[tuple[ModelName, ...], msgspec.Meta(min_length=1)]
    expires_at: datetime | None = None  # without an offset: UTC
    rpm: Positive | None = None  # requests per minute (moving window)
    tpm: Positive | None = None  # engine-counted input tokens per minute
    max_concurrent: Positive | None = None  # requests in flight at once


class AuthConfig(_Strict):
    # Without keys the gateway only serves on loopback unless this is set.
    open: bool = False
    keys: tuple[ApiKeyConfig, ...] = ()


class CacheConfig(_Strict):
    """Response cache: exact repeats of a request answered without the engine (off by default)."""

    enabled: bool = False
    # "memory": an LRU with TTL in this process; "redis": shared by every replica.
    backend: Literal["memory", "redis"] = "memory"
    ttl_s: PositiveFloat = 300.0
    max_entries: Positive = 10_000  # memory backend
    # Responses larger than this (encoded JSON) are not cached.
    max_entry_bytes: Positive = 1024 * 1024
    # Redis URL of the redis backend; None: limits.redis_url.
    redis_url: str | None = None
    # false: one key's cached answers are never served to another key.
    shared_across_keys: bool = False


class ModelConfig(_Strict, tag_field="engine"):
    """Fields every engine kind shares."""

    name: ModelName
    aliases: tuple[ModelName, ...] = ()
    timeout_s: PositiveFloat = 60.0
    # Requests admitted to this model at once (running + waiting); more get 503 + Retry-After.
    max_concurrent_requests: Positive = 256


FamilyName = Literal["auto", "qwen3", "cross-encoder", "bi-encoder", "jina-v3"]

# Which runtimes (the `engine` tag) can run which family. "auto" is checked once the family is
# detected from the checkpoint (at start, and by `rerank-gateway check-config`).
FAMILY_RUNTIMES: dict[str, frozenset[str]] = {
    # "packed": the Qwen3-only runtime that packs prompts without padding (adapters/runtimes/packed).
    "qwen3": frozenset({"transformers", "vllm-score", "vllm-generate", "packed", "gguf"}),
    # Sequence-classification heads: vLLM serves BERT/XLM-R classifiers on its pooling runner;
    # llama.cpp runs GGUF conversions that kept the head (rank pooling).
    # "openvino": the CPU runtime exported from the checkpoint (adapters/runtimes/cpu).
    "cross-encoder": frozenset({"transformers", "vllm-score", "gguf", "openvino"}),
    # Embeddings + cosine: no prompt, nothing to generate.
    "bi-encoder": frozenset({"transformers", "openvino"}),
    # Listwise remote code (model.rerank); provided by the jina-v3 family.
    "jina-v3": frozenset({"transformers"}),
}


class LocalModelConfig(ModelConfig):
    """A checkpoint scored in-process: the gateway tokenizes (and templates) itself.

    ``engine`` names the runtime, ``family`` how a (query, document) pair becomes tokens and
    the model's output a score.
    """

    path: str = DEFAULT_MODEL_PATH
    revision: str | None = None
    # "auto": read the checkpoint's config.json (architectures, id2label) and
    # sentence-transformers files (modules.json, 1_Pooling/) and log the choice.
    family: FamilyName = "auto"
    # Qwen3 only: the default instruction (other families have no instruction slot).
    instruction: str = DEFAULT_INSTRUCTION
    # Tokens per prompt (template + query + one document chunk); longer documents are chunked.
    # Capped at the checkpoint's own window (e.g. 512 for BERT / XLM-R cross-encoders).
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
    # Bi-encoders: pooling of token embeddings ("auto": from 1_Pooling/config.json, else mean).
    pooling: Literal["auto", "mean", "cls", "lasttoken"] = "auto"
    # Families shipped as remote code (jina-v3) need it; never on by default.
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        engine = str(type(self).__struct_config__.tag)
        if self.family != "auto" and engine not in FAMILY_RUNTIMES.get(self.family, frozenset()):
            runtimes = ", ".join(sorted(FAMILY_RUNTIMES.get(self.family, ())))
            raise ValueError(
                f"family {self.family!r} cannot run on engine {engine!r} (it runs on: {runtimes or 'none'})"
            )


# Kept for code written before families existed.
Qwen3LocalConfig = LocalModelConfig


class TransformersEngineConfig(LocalModelConfig, tag="transformers"):
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Padded tokens (longest prompt x rows) per forward pass, and rows per pass.
    batch_tokens: Positive = 16_384
    max_batch_size: Positive = 64
    # Forward passes running at once in worker threads (torch already uses every core).
    max_parallel_batches: Positive = 1
    # Listwise families (jina-v3): documents per model.rerank call (the old service's batch_size;
    # 64 was its T4 advice, 125 stays closer to one full listwise window at more latency).
    block_size: Positive = 64


class PackedEngineConfig(LocalModelConfig, tag="packed"):
    """Qwen3-Reranker packed without padding into varlen steps filled from every waiting request."""

    # One model replica per device, all fed from one queue: ["cuda:0", "cuda:1"]; "auto": cuda:0, else cpu.
    devices: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)] = ("auto",)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Prompt tokens per step (one forward pass) on a device; a longer prompt gets a step alone.
    batch_tokens: Positive = 16_384
    max_items_per_step: Positive = 1024
    # Which waiting request fills a step first: arrival order, or fewest tokens left.
    policy: Literal["fifo", "shortest-first"] = "fifo"
    # torch.compile(dynamic=True) of the pointwise work between the GEMMs; "auto": on CUDA only.
    compile: Literal["auto", "on", "off"] = "auto"
    # "auto": varlen flash attention on CUDA (vLLM's FA3 when vLLM is installed, else flash-attn or
    # PyTorch's varlen_attn), exact per-prompt SDPA on CPU.
    attention: Literal["auto", "varlen", "sdpa"] = "auto"


class OpenVinoEngineConfig(LocalModelConfig, tag="openvino"):
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
    # CPU threads in all (None: the cores this process may run on) and inferences in flight at
    # once, each on its share of the threads (None: what OpenVINO's throughput hint picks).
    threads: Positive | None = None
    streams: Positive | None = None
    # Rows are sorted by length and cut into batches of at most this many padded tokens / rows
    # (small batches of near-equal lengths: no padding waste, and every stream gets work).
    batch_tokens: Positive = 2048
    max_batch_size: Positive = 16
    # Parity gate of bf16 / int8, run at start: a golden set of queries x documents is scored
    # in fp32 and in the reduced precision; the precision is refused unless at least
    # parity_min_agreement of the queries keep their fp32 top-10 (same documents, same order;
    # swaps of documents whose fp32 scores differ by less than parity_tie aside).
    parity_queries: Positive = 32
    parity_documents: Annotated[int, msgspec.Meta(ge=10)] = 30
    parity_min_agreement: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.99
    parity_tie: Annotated[float, msgspec.Meta(ge=0)] = 1e-3
    # A JSON Lines file of {"query": ..., "documents": [...]} (real traffic) used as the golden
    # set instead of the generated one.
    parity_set: str | None = None


class VllmEngineConfig(LocalModelConfig):
    """A local model on vLLM's async engine; ``max_length`` is also vLLM's ``max_model_len``."""


    # "auto": float32 on CPU, bfloat16 on CUDA.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Fraction of GPU memory vLLM may take (weights + KV cache); on CPU, of RAM for the KV cache.
    # None: 0.9 on CUDA, 0.1 on CPU (where 0.9 would reserve most of the machine's RAM).
    gpu_memory_utilization: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    tensor_parallel_size: Positive = 1
    # Skip CUDA graphs / compilation: faster start, slower steps.
    enforce_eager: bool = False
    # Sequences and tokens per scheduler step (None: vLLM's defaults for the device).
    max_num_seqs: Positive | None = None
    max_num_batched_tokens: Positive | None = None
    # vLLM attention backend name (e.g. "TRITON_ATTN" or "FLEX_ATTENTION" on pre-Ampere GPUs); None: vLLM picks.
    attention_backend: str | None = None
    # Reuse the KV of the shared prompt part (system + instruction + query) across documents.
    # Causal families only: a cross-encoder's attention is bidirectional, so it is always off there.
    enable_prefix_caching: bool = True
    # Any other AsyncEngineArgs field, passed through as is (wins over the keys above).
    engine_args: dict[str, Any] = {}


class VllmScoreEngineConfig(VllmEngineConfig, tag="vllm-score"):
    """Pooling runner: Qwen3 converted online to a yes-minus-no classifier, or a cross-encoder's own head."""


class VllmGenerateEngineConfig(VllmEngineConfig, tag="vllm-generate"):
    """Causal LM, one generated token; the score is P(yes) from the yes and no log-probabilities."""


class StaticEngineConfig(ModelConfig, tag="static"):
    """Zero-cost test engine: a fixed score per document, no model. For tests and benchmarks."""

    score: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    # Scores by exact document text; documents not listed get `score`.
    scores: dict[str, Annotated[float, msgspec.Meta(ge=0, le=1)]] = {}
    # Simulated inference time per request (tests of timeouts and overload; latency models).
    delay_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # Answer raw-score requests (TEI `raw_scores`, vLLM `use_activation: false`) with the
    # logit of the score; false makes the engine one that has no raw output. Not the local
    # models' `raw_scores` (always answer raw): a static model answers raw only when asked.
    supports_raw_scores: bool = True


class UpstreamHttpConfig(ModelConfig):
    """Fields of engines that score over HTTP. ``timeout_s`` is the total per request, retries included."""

    connect_timeout_s: PositiveFloat = 5.0
    # Longest wait for the upstream's answer to one call.
    read_timeout_s: PositiveFloat = 30.0
    # The key sent as ``Authorization: Bearer``; or the name of an environment variable holding it.
    api_key: str | None = None
    api_key_env: str | None = None
    # Keep-alive connections per upstream host.
    max_connections: Positive = 64
    # Instruction used when the request has none; "" sends none (the upstream's default applies).
    instruction: str = ""


class DashScopeEngineConfig(UpstreamHttpConfig, tag="dashscope", kw_only=True):
    """Alibaba DashScope text rerank. Requests over the model's limits are split and merged."""

    # The upstream model name (gte-rerank-v2, qwen3-rerank, ...).
    model: ModelName
    # "native" = /api/v1/services/rerank/text-rerank/text-rerank; "compatible" = /compatible-api/v1/reranks.
    endpoint: Literal["native", "compatible"] = "native"
    # Region host (Beijing by default); e.g. https://dashscope-intl.aliyuncs.com for Singapore.
    base_url: str = "https://dashscope.aliyuncs.com"
    api_key_env: str | None = "DASHSCOPE_API_KEY"
    workspace: str | None = None
    # The model's limits (DashScope docs, they vary by model and region): one upstream call
    # never exceeds them; larger requests become several calls.
    max_documents_per_call: Positive = 500
    max_tokens_per_item: Positive = 4000
    max_tokens_per_request: Positive = 30_000
    max_parallel_calls: Positive = 4
    # Retries of one call after 429, 5xx or a connect error (exponential backoff, jitter, Retry-After).
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    backoff_initial_s: PositiveFloat = 0.5
    backoff_max_s: PositiveFloat = 10.0


class PoolEngineConfig(UpstreamHttpConfig, tag="pool", kw_only=True):
    """A model served by replicas of vLLM, TEI, Infinity or a Cohere-compatible server."""

    protocol: Literal["vllm", "vllm-score", "tei", "infinity", "cohere"]
    urls: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]
    # The model name sent upstream (None: omitted; the cohere protocol sends `name`).
    model: str | None = None
    # Texts per upstream call; None: the whole request in one call (32 for tei, its default limit).
    max_batch: Positive | None = None
    # Route one (instruction, query) to the same replica so its prompt prefix stays cached...
    affinity: bool = True
    # ... unless that replica has more than this many requests in flight beyond the least busy one.
    affinity_slack: Annotated[int, msgspec.Meta(ge=0)] = 4
    # Send the instruction upstream (vllm/cohere protocols; tei and infinity have no such field).
    forward_instruction: bool = True
    # Passive health: eject a replica after this many consecutive failures, for cooldown_s,
    # then probe health_path before sending it traffic again.
    eject_after_failures: Positive = 3
    cooldown_s: PositiveFloat = 10.0
    health_path: str = "/health"
    probe_timeout_s: PositiveFloat = 2.0


class GgufEngineConfig(ModelConfig, tag="gguf", kw_only=True):
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
    max_query_tokens: Positive = 2048
    max_chunks_per_doc: Positive = 10
    # Layers offloaded to the GPU (0: CPU only, -1: all); needs a CUDA/Metal build of llama-cpp-python.
    n_gpu_layers: Annotated[int, msgspec.Meta(ge=-1)] = 0
    # CPU threads for llama.cpp (None: llama-cpp-python's default, the physical cores).
    n_threads: Positive | None = None
    # Tokens and sequences per llama_decode call. An encoder must see a whole prompt in one
    # micro-batch, so batch_tokens is also llama.cpp's n_ubatch and must hold max_length.
    batch_tokens: Positive = 8192
    max_batch_size: Annotated[int, msgspec.Meta(ge=1, le=256)] = 64
    # Return the head's raw output (a cross-encoder's logit) instead of a score in [0, 1].
    raw_scores: bool = False


EngineConfig = (
    TransformersEngineConfig
    | PackedEngineConfig
    | OpenVinoEngineConfig
    | VllmScoreEngineConfig
    | VllmGenerateEngineConfig
    | StaticEngineConfig
    | DashScopeEngineConfig
    | PoolEngineConfig
    | GgufEngineConfig
)


class DialectsConfig(_Strict):
    """The non-Cohere request dialects (TEI's /rerank body and /info, vLLM's /score)."""

    # The model that serves TEI-shaped requests and GET /info (TEI bodies name no model);
    # None: the first configured model.
    tei_model: ModelName | None = None


class Settings(_Strict):
    server: ServerConfig = ServerConfig()
    logging: LoggingConfig = LoggingConfig()
    limits: LimitsConfig = LimitsConfig()
    auth: AuthConfig = AuthConfig()
    dialects: DialectsConfig = DialectsConfig()
    cache: CacheConfig = CacheConfig()
    models: tuple[EngineConfig, ...] = ()
